// bench-informer: the client-go baseline for the extender's cache (make bench, bench/cache.sh). It does
// what a Go extender would: an informer of bound, unfinished pods and one of nodes, each object trimmed by
// SetTransform to the fields gpuguard's cache reads, against bench-apiserver. It prints how long the first
// sync took and, once both informers have synced and a GC has run, its resident memory, as one JSON line.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"runtime/debug"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// The extended resources of a resource list: what gpuguard's cache keeps of requests and limits.
func extended(list corev1.ResourceList) corev1.ResourceList {
	kept := corev1.ResourceList{}
	for name, quantity := range list {
		if strings.Contains(string(name), "/") {
			kept[name] = quantity
		}
	}
	return kept
}

func trimContainers(containers []corev1.Container) []corev1.Container {
	kept := make([]corev1.Container, 0, len(containers))
	for _, c := range containers {
		kept = append(kept, corev1.Container{
			Resources:     corev1.ResourceRequirements{Requests: extended(c.Resources.Requests), Limits: extended(c.Resources.Limits)},
			RestartPolicy: c.RestartPolicy,
		})
	}
	return kept
}

func trim(object interface{}) (interface{}, error) {
	switch o := object.(type) {
	case *corev1.Pod:
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: o.Name, Namespace: o.Namespace, UID: o.UID, ResourceVersion: o.ResourceVersion},
			Spec: corev1.PodSpec{NodeName: o.Spec.NodeName, Containers: trimContainers(o.Spec.Containers),
				InitContainers: trimContainers(o.Spec.InitContainers)},
			Status: corev1.PodStatus{Phase: o.Status.Phase},
		}, nil
	case *corev1.Node:
		return &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: o.Name, ResourceVersion: o.ResourceVersion},
			Status:     corev1.NodeStatus{Allocatable: extended(o.Status.Allocatable)},
		}, nil
	}
	return object, nil
}

// VmRSS and VmHWM from /proc/self/status, in bytes.
func memory() (rss, peak int64) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(status), "\n") {
		var kb int64
		if _, err := fmt.Sscanf(line, "VmRSS: %d kB", &kb); err == nil {
			rss = kb * 1024
		}
		if _, err := fmt.Sscanf(line, "VmHWM: %d kB", &kb); err == nil {
			peak = kb * 1024
		}
	}
	return rss, peak
}

func main() {
	server := flag.String("server", "", "https://127.0.0.1:PORT of bench-apiserver")
	caFile := flag.String("ca-file", "", "CA of its serving certificate")
	flag.Parse()
	start := time.Now()

	config := &rest.Config{Host: *server, TLSClientConfig: rest.TLSClientConfig{CAFile: *caFile},
		BearerToken: "bench", QPS: -1}
	config.ContentConfig.ContentType = "application/json"
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		log.Fatal(err)
	}
	selector := fields.ParseSelectorOrDie("spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed")
	pods := cache.NewSharedIndexInformer(
		cache.NewListWatchFromClient(client.CoreV1().RESTClient(), "pods", metav1.NamespaceAll, selector),
		&corev1.Pod{}, 0, cache.Indexers{})
	nodes := cache.NewSharedIndexInformer(
		cache.NewListWatchFromClient(client.CoreV1().RESTClient(), "nodes", metav1.NamespaceAll, fields.Everything()),
		&corev1.Node{}, 0, cache.Indexers{})
	for _, informer := range []cache.SharedIndexInformer{pods, nodes} {
		if err := informer.SetTransform(trim); err != nil {
			log.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go pods.Run(ctx.Done())
	go nodes.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), pods.HasSynced, nodes.HasSynced) {
		log.Fatal("informers did not sync")
	}
	synced := time.Since(start)
	// What a steady process holds: the list's garbage collected and given back to the kernel, which the
	// Go runtime would otherwise do only minutes later.
	debug.FreeOSMemory()
	rss, peak := memory()
	json.NewEncoder(os.Stdout).Encode(map[string]interface{}{
		"sync_ms": synced.Milliseconds(), "pods": len(pods.GetStore().ListKeys()),
		"nodes": len(nodes.GetStore().ListKeys()), "rss_bytes": rss, "peak_rss_bytes": peak,
	})
}
