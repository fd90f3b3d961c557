// bench-apiserver: a Kubernetes API server just big enough to measure list-and-watch caches at cluster
// scale (make bench, bench/cache.sh). It serves N nodes and M bound pods, each pod about 1.5 KB of
// realistic JSON, from pre-built bytes, in pages as `limit` and `continue` ask, over TLS on 127.0.0.1.
// Every pod carries an nvidia.com/gpu key: a quarter of them "1", the rest "0". Watches stay open with
// bookmarks until POST /control/expire, which ends every watch with 410 Gone and refuses the versions
// before it, so that clients list again. The same server feeds gpuguard-scheduler-extender and a
// client-go informer (bench-informer), so the two are compared on the same bytes.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"
)

type server struct {
	pods, nodes [][]byte
	mu          sync.Mutex
	epoch       int // resourceVersions below epochBase(epoch) are gone
	expired     chan struct{}
}

func epochBase(epoch int) int { return 1000 + epoch*1000 }

func podJSON(i, nodes int) []byte {
	gpu := "0"
	if i%4 == 0 {
		gpu = "1"
	}
	name := fmt.Sprintf("train-%06d-7c9f8b6d5-x2k4p", i)
	node := fmt.Sprintf("gpu-node-%04d", i%nodes)
	uid := fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", i, i%65536, i%4096, (i*7)%4096, i*2654435761%(1<<48))
	return []byte(fmt.Sprintf(`{"metadata":{"name":%q,"namespace":"team-%d","uid":%q,"resourceVersion":"%d",`+
		`"creationTimestamp":"2026-11-20T10:00:00Z","labels":{"app":"trainer","pod-template-hash":"7c9f8b6d5",`+
		`"team":"team-%d","tier":"batch"},"annotations":{"kubectl.kubernetes.io/default-container":"train",`+
		`"prometheus.io/scrape":"true","prometheus.io/port":"9100"},"ownerReferences":[{"apiVersion":"apps/v1",`+
		`"kind":"ReplicaSet","name":"train-7c9f8b6d5","uid":"0b8e6a52-3d1f-4c7e-9a55-1f2e3d4c5b6a","controller":true}]},`+
		`"spec":{"nodeName":%q,"restartPolicy":"Always","serviceAccountName":"trainer","containers":[`+
		`{"name":"train","image":"nvcr.io/nvidia/pytorch:24.05-py3","command":["python","train.py"],`+
		`"env":[{"name":"EPOCHS","value":"90"},{"name":"BATCH","value":"256"},{"name":"DATA","value":"/data/imagenet"}],`+
		`"resources":{"limits":{"cpu":"8","memory":"64Gi","nvidia.com/gpu":%q},"requests":{"cpu":"8","memory":"64Gi","nvidia.com/gpu":%q}},`+
		`"volumeMounts":[{"name":"data","mountPath":"/data"},{"name":"shm","mountPath":"/dev/shm"}]},`+
		`{"name":"metrics","image":"quay.io/prometheus/node-exporter:v1.8.1","ports":[{"containerPort":9100,"protocol":"TCP"}],`+
		`"resources":{"limits":{"cpu":"100m","memory":"64Mi"},"requests":{"cpu":"50m","memory":"32Mi"}}},`+
		`{"name":"log-shipper","image":"fluent/fluent-bit:3.0","resources":{"requests":{"cpu":"50m","memory":"32Mi"}}}],`+
		`"volumes":[{"name":"data","persistentVolumeClaim":{"claimName":"imagenet"}},{"name":"shm","emptyDir":{"medium":"Memory"}}]},`+
		`"status":{"phase":"Running","hostIP":"10.0.%d.%d","podIP":"10.244.%d.%d","startTime":"2026-11-20T10:00:05Z",`+
		`"qosClass":"Burstable"}}`,
		name, i%50, uid, 1000+i%997, i%50, node, gpu, gpu, (i%nodes)/250, (i%nodes)%250, i/250%250, i%250))
}

func nodeJSON(i int) []byte {
	return []byte(fmt.Sprintf(`{"metadata":{"name":"gpu-node-%04d","uid":"node-%d","resourceVersion":"900",`+
		`"labels":{"kubernetes.io/hostname":"gpu-node-%04d","nvidia.com/gpu.product":"NVIDIA-H100-80GB-HBM3"}},`+
		`"status":{"allocatable":{"cpu":"96","memory":"1Ti","nvidia.com/gpu":"8","pods":"110"},`+
		`"capacity":{"cpu":"96","memory":"1Ti","nvidia.com/gpu":"8","pods":"110"}}}`, i, i, i))
}

func (s *server) list(w http.ResponseWriter, r *http.Request, kind string, items [][]byte) {
	query := r.URL.Query()
	start, _ := strconv.Atoi(query.Get("continue"))
	end := len(items)
	if limit, err := strconv.Atoi(query.Get("limit")); err == nil && limit > 0 && start+limit < end {
		end = start + limit
	}
	s.mu.Lock()
	version := epochBase(s.epoch)
	s.mu.Unlock()
	next := ""
	if end < len(items) {
		next = strconv.Itoa(end)
	}
	w.Header().Set("Content-Type", "application/json")
	var body bytes.Buffer
	fmt.Fprintf(&body, `{"kind":%q,"apiVersion":"v1","metadata":{"resourceVersion":"%d","continue":%q},"items":[`,
		kind, version, next)
	for i := start; i < end; i++ {
		if i > start {
			body.WriteByte(',')
		}
		body.Write(items[i])
	}
	body.WriteString("]}")
	w.Write(body.Bytes())
}

func (s *server) watch(w http.ResponseWriter, r *http.Request, kind string) {
	version, _ := strconv.Atoi(r.URL.Query().Get("resourceVersion"))
	timeout, _ := strconv.Atoi(r.URL.Query().Get("timeoutSeconds"))
	if timeout <= 0 {
		timeout = 300
	}
	s.mu.Lock()
	gone := version != 0 && version < epochBase(s.epoch)
	expired := s.expired
	current := epochBase(s.epoch)
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	flusher := w.(http.Flusher)
	goneEvent := `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure",` +
		`"message":"too old resource version","reason":"Expired","code":410}}` + "\n"
	if gone {
		fmt.Fprint(w, goneEvent)
		return
	}
	fmt.Fprintf(w, `{"type":"BOOKMARK","object":{"kind":%q,"apiVersion":"v1","metadata":{"resourceVersion":"%d"}}}`+"\n",
		kind, current)
	flusher.Flush()
	select {
	case <-expired:
		fmt.Fprint(w, goneEvent)
	case <-time.After(time.Duration(timeout) * time.Second):
	case <-r.Context().Done():
	}
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/control/expire" && r.Method == http.MethodPost {
		s.mu.Lock()
		s.epoch++
		close(s.expired)
		s.expired = make(chan struct{})
		s.mu.Unlock()
		return
	}
	if r.URL.Query().Get("sendInitialEvents") != "" {
		// Streaming lists are not served: clients fall back to paged lists, which is what is measured.
		http.Error(w, `{"kind":"Status","code":400,"message":"sendInitialEvents is not supported"}`, http.StatusBadRequest)
		return
	}
	items, kind := s.pods, "Pod"
	switch r.URL.Path {
	case "/api/v1/pods":
	case "/api/v1/nodes":
		items, kind = s.nodes, "Node"
	default:
		http.NotFound(w, r)
		return
	}
	if r.URL.Query().Get("watch") == "1" || r.URL.Query().Get("watch") == "true" {
		s.watch(w, r, kind)
		return
	}
	s.list(w, r, kind+"List", items)
}

func main() {
	pods := flag.Int("pods", 150000, "bound pods to serve")
	nodes := flag.Int("nodes", 5000, "nodes to serve")
	cert := flag.String("cert", "", "serving certificate (PEM) for 127.0.0.1")
	key := flag.String("key", "", "its private key")
	addressFile := flag.String("address-file", "", "where to write host:port once serving")
	flag.Parse()

	s := &server{expired: make(chan struct{})}
	var podBytes int
	for i := 0; i < *pods; i++ {
		s.pods = append(s.pods, podJSON(i, max(*nodes, 1)))
		podBytes += len(s.pods[i])
	}
	for i := 0; i < *nodes; i++ {
		s.nodes = append(s.nodes, nodeJSON(i))
	}
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	average := 0
	if *pods > 0 {
		average = podBytes / *pods
	}
	log.Printf("serving %d nodes and %d pods (%d bytes of pods, %d per pod) on %s", *nodes, *pods, podBytes, average,
		listener.Addr())
	if *addressFile != "" {
		if err := os.WriteFile(*addressFile, []byte(listener.Addr().String()), 0o600); err != nil {
			log.Fatal(err)
		}
	}
	log.Fatal(http.ServeTLS(listener, s, *cert, *key))
}
