// Images without a registry: each is a directory tree made here, written as a one-layer OCI image
// layout in a tar (oci-layout, index.json, blobs/sha256/...) and imported into the node's containerd,
// in the CRI's namespace, under the name the pods use.
package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// imageConfig is the part of an OCI image config that the images here set.
type imageConfig struct {
	User       string   `json:"User,omitempty"`
	Env        []string `json:"Env,omitempty"`
	Entrypoint []string `json:"Entrypoint,omitempty"`
	Cmd        []string `json:"Cmd,omitempty"`
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    map[string]string `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// importImages builds the sandbox's pause image, the CUDA-like image, gpuguard's image and, with -peers,
// NVIDIA's device plugin's (nvidia_plugin_scenario.go) and DRA driver's (nvidia_dra_scenario.go), and
// imports them.
func (e *Env) importImages(n *Node) error {
	images := filepath.Join(n.dir, "images")
	pause := filepath.Join(images, "pause")
	if err := os.MkdirAll(pause, 0o755); err != nil {
		return err
	}
	if err := copyFile(e.component("pause"), filepath.Join(pause, "pause"), 0o755); err != nil {
		return err
	}

	// What a CUDA base image does to every container made from it, on a shell that can look around.
	cuda := filepath.Join(images, "cuda-like")
	for _, dir := range []string{"bin", "proc", "dev", "sys", "tmp", "etc"} {
		if err := os.MkdirAll(filepath.Join(cuda, dir), 0o755); err != nil {
			return err
		}
	}
	if err := copyFile("/bin/busybox", filepath.Join(cuda, "bin", "busybox"), 0o755); err != nil {
		return fmt.Errorf("busybox-static (scripts/install-deps.sh installs it): %w", err)
	}
	for _, applet := range []string{"sh", "ls", "cat", "sleep", "id", "test", "tr", "grep", "head", "stat"} {
		if err := os.Symlink("busybox", filepath.Join(cuda, "bin", applet)); err != nil {
			return err
		}
	}

	// gpuguard's image: the tree the Dockerfile's final stage has, made by the same script.
	gpuguard := filepath.Join(images, "gpuguard")
	if out, err := exec.Command(e.source("scripts", "image-rootfs.sh"), e.cfg.Gpuguard, gpuguard, "--base").CombinedOutput(); err != nil {
		return fmt.Errorf("scripts/image-rootfs.sh: %w: %s", err, out)
	}

	type image struct {
		name, dir string
		config    imageConfig
	}
	var peers []image
	if e.cfg.Peers != "" {
		nvidia := filepath.Join(images, "nvidia-device-plugin")
		if err := e.nvidiaPluginRootfs(nvidia); err != nil {
			return fmt.Errorf("NVIDIA's device plugin image: %w", err)
		}
		dra := filepath.Join(images, "dra-driver-nvidia-gpu")
		if err := e.draDriverRootfs(dra); err != nil {
			return fmt.Errorf("NVIDIA's DRA driver image: %w", err)
		}
		peers = append(peers, image{nvidiaPluginImage, nvidia, nvidiaPluginImageConfig}, image{draDriverImage, dra, draDriverImageConfig})
	}
	for _, image := range append([]image{
		{pauseImage, pause, imageConfig{Entrypoint: []string{"/pause"}}},
		{cudaLikeImage, cuda, imageConfig{Env: []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"},
			Cmd: []string{"sh"}}},
		{heavyEnvImage, cuda, imageConfig{Env: []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=" + heavyValue,
			"NVIDIA_IMEX_CHANNELS=" + heavyValue, "CUDA_VERSION=" + heavyValue, "NVIDIA_REQUIRE_CUDA=" + heavyValue},
			Cmd: []string{"sh"}}},
		// As the Dockerfile says: USER 65532:65532, the webhook as the entrypoint.
		{gpuguardRepo + ":" + gpuguardTag, gpuguard, imageConfig{User: "65532:65532", Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
			Entrypoint: []string{"/usr/local/bin/gpuguard-webhook"},
			Cmd:        []string{"--tls-cert-file=/etc/gpuguard/tls/tls.crt", "--tls-private-key-file=/etc/gpuguard/tls/tls.key"}}},
	}, peers...) {
		archive := image.dir + ".tar"
		if err := writeImageArchive(archive, image.name, image.dir, image.config); err != nil {
			return fmt.Errorf("image %s: %w", image.name, err)
		}
		if err := n.runtime.importImage(e, n, archive, image.name); err != nil {
			return err
		}
	}
	return nil
}

// heavyValue is 64 KiB: the longest value the enforcer read before it bounded what it reads.
var heavyValue = strings.Repeat("7", 64<<10)

// writeImageArchive writes rootfs as a one-layer image named name into an OCI image layout tar.
func writeImageArchive(path, name, rootfs string, config imageConfig) error {
	var layer bytes.Buffer
	if err := tarTree(&layer, rootfs); err != nil {
		return err
	}
	layerDigest := digestOf(layer.Bytes())
	configJSON, err := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux", "config": config,
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	})
	if err != nil {
		return err
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        descriptor{MediaType: "application/vnd.oci.image.config.v1+json", Digest: digestOf(configJSON), Size: int64(len(configJSON))},
		"layers":        []descriptor{{MediaType: "application/vnd.oci.image.layer.v1.tar", Digest: layerDigest, Size: int64(layer.Len())}},
	})
	if err != nil {
		return err
	}
	// Without a platform the import stores nothing under the name; the name is containerd's annotation.
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"manifests": []descriptor{{MediaType: "application/vnd.oci.image.manifest.v1+json", Digest: digestOf(manifest), Size: int64(len(manifest)),
			Platform:    map[string]string{"architecture": "amd64", "os": "linux"},
			Annotations: map[string]string{"io.containerd.image.name": name}}},
	})
	if err != nil {
		return err
	}

	out, err := os.Create(path)
	if err != nil {
		return err
	}
	defer out.Close()
	w := tar.NewWriter(out)
	files := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blobPath(layerDigest), layer.Bytes()},
		{blobPath(digestOf(configJSON)), configJSON},
		{blobPath(digestOf(manifest)), manifest},
	}
	for _, dir := range []string{"blobs", "blobs/sha256"} {
		if err := w.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: 0o755}); err != nil {
			return err
		}
	}
	for _, f := range files {
		if err := w.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: 0o644, Size: int64(len(f.data))}); err != nil {
			return err
		}
		if _, err := w.Write(f.data); err != nil {
			return err
		}
	}
	if err := w.Close(); err != nil {
		return err
	}
	return out.Close()
}

// tarTree writes the tree under root as a layer: paths relative to it, with modes, owners and links.
func tarTree(out io.Writer, root string) error {
	w := tar.NewWriter(out)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == root {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(path); err != nil {
				return err
			}
		}
		header, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		header.Name = rel
		if d.IsDir() {
			header.Name += "/"
		}
		if stat, ok := info.Sys().(*syscall.Stat_t); ok {
			header.Uid, header.Gid = int(stat.Uid), int(stat.Gid)
		}
		header.Uname, header.Gname = "", ""
		if err := w.WriteHeader(header); err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := io.Copy(w, f); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return w.Close()
}

func digestOf(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func blobPath(digest string) string { return "blobs/sha256/" + digest[len("sha256:"):] }

// copyLibraries copies into the image tree dir the shared libraries each object loads, at their paths
// on this machine, as ldd names them.
func copyLibraries(dir string, objects ...string) error {
	for _, object := range objects {
		out, err := exec.Command("ldd", object).Output()
		if err != nil {
			return fmt.Errorf("ldd %s: %w", object, err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			// "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or "/lib64/ld-linux-x86-64.so.2 (0x…)"
			fields := strings.Fields(line)
			path := ""
			if len(fields) >= 3 && fields[1] == "=>" {
				path = fields[2]
			} else if len(fields) >= 1 && strings.HasPrefix(fields[0], "/") {
				path = fields[0]
			}
			if path == "" {
				continue
			}
			if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(path)), 0o755); err != nil {
				return err
			}
			if err := copyFile(path, filepath.Join(dir, path), 0o755); err != nil {
				return err
			}
		}
	}
	return nil
}

func copyFile(from, to string, mode fs.FileMode) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, data, mode)
}
