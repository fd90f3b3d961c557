// bench-burst: the connection burst of make bench (bench/run.sh, issue 15). It opens N fresh TLS
// connections at once, as many apiservers restarting together would, sends one review on each and reads
// the answer, and prints how many failed and the latency percentiles from dial to answer, as one JSON
// line. wrk cannot do this: it keeps its connections alive.
//
// With --requests N above 1, each connection instead stays alive and sends N reviews one after another:
// a fixed count of requests, which wrk cannot give either, for per-request figures under callgrind and
// strace (bench/webhook_ab.sh).
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"sort"
	"sync"
	"time"
)

type result struct {
	Connections int     `json:"connections"`
	Requests    int     `json:"requests"`
	Errors      int     `json:"errors"`
	FirstError  string  `json:"first_error,omitempty"`
	WallMs      float64 `json:"wall_ms"`
	P50Ms       float64 `json:"p50_ms"`
	P99Ms       float64 `json:"p99_ms"`
	MaxMs       float64 `json:"max_ms"`
}

func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p * float64(len(sorted)-1))
	return float64(sorted[i].Microseconds()) / 1000
}

func main() {
	url := flag.String("url", "", "https://127.0.0.1:PORT/mutate")
	caFile := flag.String("ca", "", "CA certificate that signed the server's")
	bodyFile := flag.String("body", "", "the AdmissionReview to send")
	connections := flag.Int("connections", 2000, "fresh connections, all opened at once")
	requests := flag.Int("requests", 1, "reviews sent on each connection, one after another; above 1 the connection is kept alive")
	flag.Parse()
	if *url == "" || *caFile == "" || *bodyFile == "" || *connections < 1 || *requests < 1 {
		log.Fatal("usage: bench-burst --url URL --ca CA --body REVIEW [--connections N] [--requests N]")
	}
	caPEM, err := os.ReadFile(*caFile)
	if err != nil {
		log.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		log.Fatalf("%s holds no PEM certificate", *caFile)
	}
	body, err := os.ReadFile(*bodyFile)
	if err != nil {
		log.Fatal(err)
	}
	// One transport per connection. With one request each, keep-alives off: every request pays for its own
	// TCP and TLS handshake. With more, the transport keeps its one connection for all of them.
	newClient := func() *http.Client {
		return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
			DisableKeepAlives:   *requests == 1,
			MaxIdleConnsPerHost: 1,
		}}
	}
	post := func(client *http.Client) error {
		response, err := client.Post(*url, "application/json", bytes.NewReader(body))
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, response.Body)
		response.Body.Close()
		if err == nil && response.StatusCode != http.StatusOK {
			err = fmt.Errorf("status %d", response.StatusCode)
		}
		return err
	}

	latencies := make([]time.Duration, *connections)
	failures := make([]error, *connections)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < *connections; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			client := newClient()
			<-start
			began := time.Now()
			var err error
			for r := 0; r < *requests && err == nil; r++ {
				err = post(client)
			}
			latencies[i] = time.Since(began)
			failures[i] = err
		}(i)
	}
	began := time.Now()
	close(start)
	wg.Wait()
	out := result{Connections: *connections, Requests: *connections * *requests, WallMs: float64(time.Since(began).Microseconds()) / 1000}
	var ok []time.Duration
	for i, err := range failures {
		if err != nil {
			if out.Errors == 0 {
				out.FirstError = err.Error()
			}
			out.Errors++
			continue
		}
		ok = append(ok, latencies[i])
	}
	sort.Slice(ok, func(a, b int) bool { return ok[a] < ok[b] })
	out.P50Ms, out.P99Ms = percentile(ok, 0.50), percentile(ok, 0.99)
	if len(ok) > 0 {
		out.MaxMs = float64(ok[len(ok)-1].Microseconds()) / 1000
	}
	line, _ := json.Marshal(out)
	fmt.Println(string(line))
	if out.Errors > 0 {
		os.Exit(1)
	}
}
