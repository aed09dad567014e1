// Command loadgen sends chat requests to an OpenAI-compatible endpoint from
// a fixed number of workers and prints what the clients saw: requests,
// errors, throughput, and latency (time to first byte for streams).
// -log writes one line per request as well, for scripts that need the
// throughput or latency of a time window (scripts/chaos.sh). SIGINT or
// SIGTERM stops it early: no new request is sent, the ones under way finish
// (each within -timeout), and the summary is printed.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	url := flag.String("url", "http://127.0.0.1:7770/v1/chat/completions", "Endpoint to send chat requests to.")
	workers := flag.Int("c", 4, "Concurrent workers, each with its own keep-alive connection.")
	dur := flag.Duration("d", 10*time.Second, "How long to send for.")
	stream := flag.Bool("stream", false, "Ask for SSE streams and time the first byte of the body.")
	maxTokens := flag.Int("max-tokens", 8, "max_tokens of each request.")
	bodySize := flag.Int("body", 2000, "Approximate request body size in bytes.")
	turns := flag.Int("turns", 3, "Messages grow over this many turns per conversation, as an agent loop's do.")
	flag.StringVar(&model, "model", "sim-30b", "Model the requests name: warmroute routes by it (the simulated replicas serve sim-30b).")
	printBody := flag.Bool("print-body", false, "Print one request body (for wrk) and exit.")
	timeout := flag.Duration("timeout", time.Minute, "Timeout of one request, its whole answer included; a run lasts at most -d plus this.")
	logPath := flag.String("log", "", "Write one tab-separated line per request to this file: start and end (Unix microseconds), latency as measured (microseconds, 0 for an error), and ok or the error.")
	flag.Parse()
	if *printBody {
		os.Stdout.Write(chatBody(0, *turns, *bodySize, *maxTokens, *stream))
		return
	}

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *workers}, Timeout: *timeout}
	var logw *bufio.Writer
	if *logPath != "" {
		f, err := os.Create(*logPath)
		if err != nil {
			fmt.Fprintln(os.Stderr, "loadgen:", err)
			os.Exit(2)
		}
		defer f.Close()
		logw = bufio.NewWriter(f)
	}
	stop := make(chan struct{})
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() { <-sigs; close(stop) }()
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	var mu sync.Mutex
	var lat []float64
	errs := map[string]int{}
	sent := 0
	deadline := time.Now().Add(*dur)
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline) && !stopped(); i++ {
				body := chatBody(w, i%max(*turns, 1), *bodySize, *maxTokens, *stream)
				t0 := time.Now()
				d, err := do(client, *url, body, *stream)
				t1 := time.Now()
				mu.Lock()
				sent++
				outcome := "ok"
				if err != nil {
					errs[err.Error()]++
					outcome = strings.ReplaceAll(err.Error(), "\n", " ")
				} else {
					lat = append(lat, float64(d.Microseconds()))
				}
				if logw != nil {
					fmt.Fprintf(logw, "%d\t%d\t%d\t%s\n", t0.UnixMicro(), t1.UnixMicro(), d.Microseconds(), outcome)
				}
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	elapsed := time.Since(start)
	sort.Float64s(lat)
	pct := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return lat[int(p/100*float64(len(lat)-1))]
	}
	nerr := 0
	for _, n := range errs {
		nerr += n
	}
	fmt.Printf("requests=%d errors=%d rps=%.0f p50_us=%.0f p99_us=%.0f max_us=%.0f\n", sent, nerr, float64(sent)/elapsed.Seconds(), pct(50), pct(99), pct(100))
	for e, n := range errs {
		fmt.Printf("  error x%d: %s\n", n, e)
	}
	if logw != nil {
		if err := logw.Flush(); err != nil {
			fmt.Fprintln(os.Stderr, "loadgen: -log:", err)
			os.Exit(2)
		}
	}
	if nerr > 0 {
		os.Exit(1)
	}
}

// chatBody is conversation w at turn t: a system prompt of about size bytes,
// then t user/assistant exchanges.
// model is the -model flag.
var model string

func chatBody(w, t, size, maxTokens int, stream bool) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"model":%q,"stream":%v,"max_tokens":%d,"messages":[{"role":"system","content":"worker %d %s"}`, model, stream, maxTokens, w, strings.Repeat("context ", size/8))
	for i := 0; i < t; i++ {
		fmt.Fprintf(&b, `,{"role":"user","content":"question %d"},{"role":"assistant","content":"answer %d"}`, i, i)
	}
	b.WriteString(`,{"role":"user","content":"next"}]}`)
	return b.Bytes()
}

// do sends one request and returns the time to the first body byte (for a
// stream) or to the whole answer, or an error naming what the client saw.
func do(c *http.Client, url string, body []byte, stream bool) (time.Duration, error) {
	start := time.Now()
	resp, err := c.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("transport: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		io.Copy(io.Discard, resp.Body)
		return 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	var first time.Duration
	br := bufio.NewReader(resp.Body)
	if _, err := br.Peek(1); err != nil {
		return 0, fmt.Errorf("body: %v", err)
	}
	first = time.Since(start)
	rest, err := io.ReadAll(br)
	if err != nil {
		return 0, fmt.Errorf("body cut: %v", err)
	}
	if stream && !bytes.Contains(rest, []byte("[DONE]")) {
		return 0, fmt.Errorf("stream ended without [DONE]")
	}
	if !stream {
		return time.Since(start), nil
	}
	return first, nil
}
