// Command streams holds many slow SSE streams open at once through a proxy:
// it opens -n streaming chat requests, prints "open N" when every one has
// its first byte, reads them all to the end, and prints what it saw.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:7770", "The proxy's address.")
	n := flag.Int("n", 10000, "Streams to hold open at once.")
	rate := flag.Int("rate", 0, "Streams opened a second; 0 opens them as fast as the accept backlog allows.")
	flag.Parse()
	body := []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"slow"}]}`)
	req := fmt.Appendf(nil, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	var opened, done, failed atomic.Int64
	var wg sync.WaitGroup
	allOpen := make(chan struct{})
	start := time.Now()
	for i := 0; i < *n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTimeout("tcp", *addr, 10*time.Second)
			if err != nil {
				failed.Add(1)
				if opened.Add(1) == int64(*n) {
					close(allOpen)
				}
				return
			}
			defer c.Close()
			c.Write(req)
			br := bufio.NewReaderSize(c, 4096)
			_, err = br.Peek(1)
			if opened.Add(1) == int64(*n) {
				close(allOpen)
			}
			if err != nil {
				failed.Add(1)
				return
			}
			// Connection: close, so the answer ends when the proxy closes.
			rest, err := io.ReadAll(io.LimitReader(br, 1<<20))
			if err != nil || !bytes.Contains(rest, []byte("[DONE]")) || !bytes.HasSuffix(rest, []byte("0\r\n\r\n")) {
				failed.Add(1)
				return
			}
			done.Add(1)
		}()
		switch {
		case *rate > 0:
			time.Sleep(time.Until(start.Add(time.Duration(i+1) * time.Second / time.Duration(*rate))))
		case i%500 == 499:
			time.Sleep(20 * time.Millisecond) // stay under the accept backlog
		}
	}
	<-allOpen
	fmt.Printf("open %d after %v\n", *n, time.Since(start).Round(time.Millisecond))
	os.Stdout.Sync()
	wg.Wait()
	fmt.Printf("streams=%d completed=%d failed=%d\n", *n, done.Load(), failed.Load())
	if failed.Load() > 0 {
		os.Exit(1)
	}
}
