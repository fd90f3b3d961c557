// bench-gowebhook: the Go peer of make bench (bench/run.sh, issue 15). A mutating webhook written the
// plain Go way, as agnhost's and most in-house webhooks are: net/http and crypto/tls from the standard
// library, the AdmissionReview and Pod decoded with encoding/json into the k8s.io/api types, a JSON
// Patch marshalled back. It does the core of gpuguard's job (every container that requests no
// nvidia.com/gpu ends with exactly one NVIDIA_VISIBLE_DEVICES=none), so that the same loads measure both
// servers in one run: requests/s, latency and memory. It is a yardstick, not a second implementation.
package main

import (
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

const visibleDevices = "NVIDIA_VISIBLE_DEVICES"

type patchOperation struct {
	Op    string      `json:"op"`
	Path  string      `json:"path"`
	Value interface{} `json:"value,omitempty"`
}

func asksForGPU(c *corev1.Container) bool {
	for _, list := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
		if q, ok := list["nvidia.com/gpu"]; ok && !q.Equal(resource.Quantity{}) {
			return true
		}
	}
	return false
}

// The operations that leave a container asking for no GPU with one NVIDIA_VISIBLE_DEVICES=none.
func hide(field string, index int, c *corev1.Container) []patchOperation {
	none := corev1.EnvVar{Name: visibleDevices, Value: "none"}
	base := fmt.Sprintf("/spec/%s/%d/env", field, index)
	if c.Env == nil {
		return []patchOperation{{Op: "add", Path: base, Value: []corev1.EnvVar{none}}}
	}
	var ops []patchOperation
	found := -1
	for i := len(c.Env) - 1; i >= 0; i-- {
		if c.Env[i].Name != visibleDevices {
			continue
		}
		if found >= 0 {
			ops = append(ops, patchOperation{Op: "remove", Path: fmt.Sprintf("%s/%d", base, found)})
		}
		found = i
	}
	switch {
	case found < 0:
		ops = append(ops, patchOperation{Op: "add", Path: base + "/-", Value: none})
	case c.Env[found].Value != "none" || c.Env[found].ValueFrom != nil:
		ops = append(ops, patchOperation{Op: "replace", Path: fmt.Sprintf("%s/%d", base, found), Value: none})
	}
	return ops
}

func review(body []byte) ([]byte, error) {
	var in admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &in); err != nil || in.Request == nil {
		return nil, fmt.Errorf("not an AdmissionReview: %v", err)
	}
	response := &admissionv1.AdmissionResponse{UID: in.Request.UID, Allowed: true}
	if in.Request.Kind.Kind == "Pod" && in.Request.Operation == admissionv1.Create {
		var pod corev1.Pod
		if err := json.Unmarshal(in.Request.Object.Raw, &pod); err != nil {
			return nil, err
		}
		var ops []patchOperation
		for field, containers := range map[string][]corev1.Container{
			"initContainers": pod.Spec.InitContainers, "containers": pod.Spec.Containers} {
			for i := range containers {
				if !asksForGPU(&containers[i]) {
					ops = append(ops, hide(field, i, &containers[i])...)
				}
			}
		}
		if len(ops) > 0 {
			patch, err := json.Marshal(ops)
			if err != nil {
				return nil, err
			}
			patchType := admissionv1.PatchTypeJSONPatch
			response.Patch, response.PatchType = patch, &patchType
		}
	}
	return json.Marshal(admissionv1.AdmissionReview{TypeMeta: in.TypeMeta, Response: response})
}

func main() {
	listen := flag.String("listen-address", "127.0.0.1:0", "where to listen")
	certFile := flag.String("tls-cert-file", "", "serving certificate (PEM)")
	keyFile := flag.String("tls-private-key-file", "", "its private key (PEM)")
	flag.Parse()
	certificate, err := tls.LoadX509KeyPair(*certFile, *keyFile)
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	mux.HandleFunc("/mutate", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 7<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
			return
		}
		answer, err := review(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(answer)
	})
	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	// The line bench/run.sh waits for, as it waits for gpuguard's "listening".
	fmt.Fprintf(os.Stderr, "{\"msg\":\"listening\",\"address\":%q}\n", listener.Addr().String())
	server := &http.Server{
		Handler:     mux,
		TLSConfig:   &tls.Config{Certificates: []tls.Certificate{certificate}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}},
		ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 120 * time.Second,
	}
	log.Fatal(server.ServeTLS(listener, "", ""))
}
