//go:build ignore

// crio-import puts one OCI archive into CRI-O's image store under a name, as `ctr images import` does for
// containerd: the harness builds its images as OCI archives and has no registry, and CRI-O's PullImage
// takes registry names only (its server/image_pull.go) and has no import command. scripts/build-peers
// copies this file into the unpacked CRI-O source as its cmd/gpuguard-e2e-crio-import and builds it there
// with CRI-O's own vendored containers/image and containers/storage, in the same build as crio, so the
// store is written by the code that reads it; only there do those packages resolve, hence the build tag.
//
//	crio-import GRAPHROOT RUNROOT DRIVER ARCHIVE NAME
//
// GRAPHROOT, RUNROOT and DRIVER are crio.conf's root, runroot and storage_driver. CRI-O may be running:
// containers/storage locks the store.
package main

import (
	"context"
	"fmt"
	"os"

	"go.podman.io/image/v5/copy"
	"go.podman.io/image/v5/docker/reference"
	ociarchive "go.podman.io/image/v5/oci/archive"
	"go.podman.io/image/v5/signature"
	istorage "go.podman.io/image/v5/storage"
	"go.podman.io/storage"
	"go.podman.io/storage/pkg/reexec"
)

func main() {
	if reexec.Init() { // containers/storage runs parts of itself again in a child, as crio's main allows
		return
	}
	if len(os.Args) != 6 {
		fmt.Fprintln(os.Stderr, "usage: crio-import GRAPHROOT RUNROOT DRIVER ARCHIVE NAME")
		os.Exit(2)
	}
	if err := importArchive(os.Args[1], os.Args[2], os.Args[3], os.Args[4], os.Args[5]); err != nil {
		fmt.Fprintf(os.Stderr, "crio-import: %s as %s: %v\n", os.Args[4], os.Args[5], err)
		os.Exit(1)
	}
}

func importArchive(graphRoot, runRoot, driver, archive, name string) error {
	store, err := storage.GetStore(storage.StoreOptions{GraphRoot: graphRoot, RunRoot: runRoot, GraphDriverName: driver})
	if err != nil {
		return fmt.Errorf("opening the store: %w", err)
	}
	defer func() { _, _ = store.Shutdown(false) }()
	named, err := reference.ParseNormalizedNamed(name)
	if err != nil {
		return err
	}
	destination, err := istorage.Transport.NewStoreReference(store, named, "")
	if err != nil {
		return err
	}
	source, err := ociarchive.NewReference(archive, "") // "": the archive's only image
	if err != nil {
		return err
	}
	// The archive is the harness's own build; there is no signature to check.
	policy, err := signature.NewPolicyContext(&signature.Policy{Default: signature.PolicyRequirements{signature.NewPRInsecureAcceptAnything()}})
	if err != nil {
		return err
	}
	defer func() { _ = policy.Destroy() }()
	_, err = copy.Image(context.Background(), policy, destination, source, &copy.Options{})
	return err
}
