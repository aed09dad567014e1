package pinstore

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/benchmarks/redistest"

	"github.com/warmroute/warmroute/prefixcache"
)

// logBuf collects a store's log lines.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuf) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// eventually polls cond until it holds or d passed.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(2 * time.Millisecond) // poll interval
	}
}

// testTimeout is the read budget of the tests that expect reads to land:
// generous, so a loaded machine does not turn a round trip into a timeout.
const testTimeout = 500 * time.Millisecond

func open(t testing.TB, r *redistest.Server, opt Options) (*Store, *logBuf) {
	t.Helper()
	var lb logBuf
	if opt.Logger == nil {
		opt.Logger = lb.logger()
	}
	if opt.Timeout == 0 {
		opt.Timeout = testTimeout
	}
	if opt.RetryInterval == 0 {
		opt.RetryInterval = 50 * time.Millisecond
	}
	s, err := Open(r.URL(), opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, &lb
}

func waitUp(t testing.TB, s *Store) {
	t.Helper()
	eventually(t, 10*time.Second, "store up", s.Up)
}

func link(i int) prefixcache.Link {
	return prefixcache.Link{Hash: uint64(i)*0x9E3779B97F4A7C15 + 1, Check: uint64(i) ^ 0xABCDEF}
}

func TestParseURL(t *testing.T) {
	good := map[string]struct {
		addr string
		db   int
	}{
		"redis://127.0.0.1:6379/0":         {"127.0.0.1:6379", 0},
		"redis://redis:6380/3":             {"redis:6380", 3},
		"redis://user:pass@10.0.0.1:7000/": {"10.0.0.1:7000", 0},
		"redis://host":                     {"host:6379", 0},
		"rediss://host:6390/1":             {"host:6390", 1},
		"redis://[::1]:6379/2":             {"[::1]:6379", 2},
	}
	for u, want := range good {
		o, err := ParseURL(u)
		if err != nil {
			t.Errorf("%s: %v", u, err)
			continue
		}
		if o.InitAddress[0] != want.addr || o.SelectDB != want.db {
			t.Errorf("%s: addr %v db %d, want %s db %d", u, o.InitAddress, o.SelectDB, want.addr, want.db)
		}
	}
	o, _ := ParseURL("redis://alice:s3cret@h:1/0")
	if o.Username != "alice" || o.Password != "s3cret" {
		t.Errorf("user %q password %q", o.Username, o.Password)
	}
	bad := map[string]string{
		"":                                "scheme",
		"127.0.0.1:6379":                  "",
		"http://h:6379/0":                 "scheme",
		"redis://h:6379/x":                "database",
		"redis://h:6379/0/1":              "path",
		"redis://:6379/0":                 "no host",
		"redis://h:port/0":                "",
		"redis://h:6379/0?addr=h2:6379":   "one Redis",
		"redis://h:6379/0?master_set=m":   "one Redis",
		"redis://h:6379/-1":               "negative",
		"redis://h:6379/?dial_timeout=xs": "dial timeout",
		"unix://":                         "socket path",
	}
	for u, want := range bad {
		_, err := ParseURL(u)
		if err == nil {
			t.Errorf("%q: no error", u)
			continue
		}
		if !strings.HasPrefix(err.Error(), "pinstore: bad URL") || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error about %q", u, err, want)
		}
		if _, err := Open(u, Options{}); err == nil {
			t.Errorf("Open(%q): no error", u)
		}
	}
	if _, err := Open("redis://h:6379/0", Options{TTL: -time.Second}); err == nil {
		t.Error("negative TTL: no error")
	}
}

// TestPutGetAcrossInstances: a pin one instance writes is read by another,
// a second read is served by the client-side cache, and a pin moved by the
// first instance reaches the second through Redis's invalidation.
func TestPutGetAcrossInstances(t *testing.T) {
	r := redistest.Start(t)
	a, _ := open(t, r, Options{})
	b, _ := open(t, r, Options{})
	waitUp(t, a)
	waitUp(t, b)

	l := link(1)
	if v, ok := b.Get(l); ok {
		t.Fatalf("empty Redis: got %q", v)
	}
	a.Put(l, "10.0.0.5:8000")
	eventually(t, 5*time.Second, "a's pin seen by b", func() bool {
		v, ok := b.Get(l)
		return ok && v == "10.0.0.5:8000"
	})
	before := b.Stats()
	if v, ok := b.Get(l); !ok || v != "10.0.0.5:8000" {
		t.Fatalf("second read: %q %v", v, ok)
	}
	if st := b.Stats(); st.CacheHits != before.CacheHits+1 {
		t.Errorf("second read not served by the client-side cache: %+v then %+v", before, st)
	}
	buf, ok := b.AppendGet([]byte("x="), l)
	if !ok || string(buf) != "x=10.0.0.5:8000" {
		t.Errorf("AppendGet: %q %v", buf, ok)
	}

	// The pin moves: b's cached read is invalidated by Redis.
	a.Put(l, "10.0.0.6:8000")
	eventually(t, 5*time.Second, "moved pin seen by b", func() bool {
		v, ok := b.Get(l)
		return ok && v == "10.0.0.6:8000"
	})

	// A Responses id.
	a.PutID("resp_0123456789abcdef", "10.0.0.7:8000")
	eventually(t, 5*time.Second, "id pin seen by b", func() bool {
		v, ok := b.GetID("resp_0123456789abcdef")
		return ok && v == "10.0.0.7:8000"
	})
	if _, ok := b.GetID("resp_other"); ok {
		t.Error("an unknown id is pinned")
	}
	st := b.Stats()
	if st.Hits == 0 || st.Misses == 0 || st.ReadErrors != 0 || st.Errors != 0 || !st.Up {
		t.Errorf("b's stats: %+v", st)
	}
	// a counts a write when Redis's answer reaches it, which may be after b
	// read the pin.
	eventually(t, 5*time.Second, "a's writes counted", func() bool { return a.Stats().Writes == 3 })
	if st := a.Stats(); st.Dropped != 0 || st.Errors != 0 {
		t.Errorf("a's stats: %+v", st)
	}
	var m bytes.Buffer
	b.WritePrometheus(&m)
	for _, want := range []string{`warmroute_pin_store_reads_total{result="hit"} `, `warmroute_pin_store_reads_total{result="skipped"} 0`, `warmroute_pin_store_up 1`, `warmroute_pin_store_errors_total 0`} {
		if !strings.Contains(m.String(), want) {
			t.Errorf("metrics lack %q:\n%s", want, m.String())
		}
	}
}

// TestSync: once Sync returns, every pin queued before it is in Redis, for
// another instance to read at once; on a closed store it returns.
func TestSync(t *testing.T) {
	r := redistest.Start(t)
	a, _ := open(t, r, Options{})
	b, _ := open(t, r, Options{})
	waitUp(t, a)
	waitUp(t, b)
	const n = 200
	for i := 0; i < n; i++ {
		a.Put(link(i), fmt.Sprintf("10.0.0.%d:8000", i%250))
	}
	a.Sync()
	if st := a.Stats(); st.Writes != n || st.Dropped != 0 {
		t.Fatalf("after Sync: %+v, want %d writes", st, n)
	}
	for i := 0; i < n; i++ {
		if v, ok := b.Get(link(i)); !ok || v != fmt.Sprintf("10.0.0.%d:8000", i%250) {
			t.Fatalf("pin %d after Sync: %q %v", i, v, ok)
		}
	}
	a.Close()
	a.Put(link(n), "10.0.0.1:8000")
	a.Sync() // returns: the store is closed
}

// TestKeyAndTTL: a pin's key is the prefix and 16 bytes, its value the
// address, and it expires after TTL (checked with PTTL, not by waiting).
func TestKeyAndTTL(t *testing.T) {
	r := redistest.Start(t)
	s, _ := open(t, r, Options{TTL: 90 * time.Second, Prefix: "t:"})
	waitUp(t, s)
	l := prefixcache.Link{Hash: 0x0102030405060708, Check: 0x1112131415161718}
	s.Put(l, "10.0.0.5:8000")
	key := "t:\x01\x02\x03\x04\x05\x06\x07\x08\x11\x12\x13\x14\x15\x16\x17\x18"
	eventually(t, 5*time.Second, "pin written", func() bool {
		v, err := redistest.Do(r.Addr, "GET", key)
		return err == nil && v == "10.0.0.5:8000"
	})
	pttl := redistest.DoInt(t, r.Addr, "PTTL", key)
	if pttl <= 80_000 || pttl > 90_000 {
		t.Errorf("PTTL %d ms, want just under 90000", pttl)
	}
	if n := redistest.DoInt(t, r.Addr, "DBSIZE"); n != 1 {
		t.Errorf("DBSIZE %d, want 1", n)
	}
	// A short TTL really expires: the key is gone and the store misses.
	short, _ := open(t, r, Options{TTL: 30 * time.Millisecond, Prefix: "t:"})
	waitUp(t, short)
	short.Put(link(2), "10.0.0.9:8000")
	eventually(t, 5*time.Second, "short pin written", func() bool { return short.Stats().Writes == 1 })
	shortKey := string(AppendLinkKey([]byte("t:"), link(2)))
	eventually(t, 5*time.Second, "short pin expired", func() bool { return redistest.DoInt(t, r.Addr, "EXISTS", shortKey) == 0 })
	if _, ok := short.Get(link(2)); ok {
		t.Error("an expired pin was read")
	}
}

// TestMemoryPerPin measures what a pin costs Redis with a typical address:
// the numbers stated in the package doc. MEMORY USAGE counts the key, the
// value and the main dictionary's entry; used_memory adds the expires
// dictionary's entry and both dictionaries' buckets. A read through the
// client-side cache adds an entry to Redis's tracking table until the key
// changes or the reader disconnects.
func TestMemoryPerPin(t *testing.T) {
	r := redistest.Start(t)
	const n, reads = 20000, 5000
	for _, prefix := range []string{DefaultPrefix, "wr:"} {
		if _, err := redistest.Do(r.Addr, "FLUSHALL"); err != nil {
			t.Fatal(err)
		}
		w, _ := open(t, r, Options{QueueSize: 1 << 15, Prefix: prefix})
		rd, _ := open(t, r, Options{Prefix: prefix})
		waitUp(t, w)
		waitUp(t, rd)
		base := redistest.UsedMemory(t, r.Addr)
		for i := range n {
			w.Put(link(i), fmt.Sprintf("10.0.%d.%d:8000", i/250%250, i%250))
			if i%2000 == 1999 { // let the writer keep up: this test measures memory, not drops
				eventually(t, 10*time.Second, "batch written", func() bool { return w.Stats().Writes == uint64(i+1) })
			}
		}
		eventually(t, 10*time.Second, "pins written", func() bool { return redistest.DoInt(t, r.Addr, "DBSIZE") == n })
		perPin := float64(redistest.UsedMemory(t, r.Addr)-base) / n
		k := AppendLinkKey([]byte(prefix), link(7))
		usage := redistest.DoInt(t, r.Addr, "MEMORY", "USAGE", string(k))

		base = redistest.UsedMemory(t, r.Addr)
		var wg sync.WaitGroup
		var unread atomic.Int64
		for g := range 8 { // concurrent reads share round trips: the test stays short under -race
			wg.Go(func() {
				for i := g; i < reads; i += 8 {
					if _, ok := rd.Get(link(i)); !ok {
						unread.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if unread.Load() != 0 {
			t.Fatalf("%d pins not read: %+v", unread.Load(), rd.Stats())
		}
		perRead := float64(redistest.UsedMemory(t, r.Addr)-base) / reads
		t.Logf("prefix %q: key %d bytes, value %d bytes; MEMORY USAGE %d bytes; used_memory %.1f bytes a pin over %d pins, and %.1f more for each of %d pins read through the client-side cache (tracking table)",
			prefix, len(k), len("10.0.0.7:8000"), usage, perPin, n, perRead, reads)
		if usage > 110 || perPin > 200 {
			t.Errorf("a pin costs more than the package doc says: MEMORY USAGE %d, used_memory %.1f a pin", usage, perPin)
		}
		w.Close()
		rd.Close()
	}
}

// TestOpenWhileRedisDown: the store opens at once without Redis, skips its
// reads, drops nothing that it cannot hold, logs the outage once, and is up
// with pins flowing once Redis comes.
func TestOpenWhileRedisDown(t *testing.T) {
	start := time.Now()
	r := redistest.New(t)
	s, lb := open(t, r, Options{})
	if d := time.Since(start); d > time.Second {
		t.Errorf("Open took %v with Redis down", d)
	}
	eventually(t, 5*time.Second, "outage logged", func() bool { return lb.count("pin store unreachable") == 1 })
	for i := range 100 {
		s.Put(link(i), "10.0.0.1:8000")
		if _, ok := s.Get(link(i)); ok {
			t.Fatal("a read succeeded without Redis")
		}
	}
	if st := s.Stats(); st.Skipped != 100 || st.Up {
		t.Errorf("stats while down: %+v", st)
	}
	r.Start()
	waitUp(t, s)
	s.Put(link(1000), "10.0.0.2:8000")
	eventually(t, 5*time.Second, "pin after Redis came", func() bool {
		v, ok := s.Get(link(1000))
		return ok && v == "10.0.0.2:8000"
	})
	if n := lb.count("pin store unreachable"); n != 1 {
		t.Errorf("outage logged %d times:\n%s", n, lb)
	}
	if n := lb.count("pin store reachable again"); n != 1 {
		t.Errorf("recovery logged %d times:\n%s", n, lb)
	}
}

// TestRedisStoppedMidRun: Redis killed under reads and writes. No call fails
// or blocks: after the first failure every read is skipped without touching
// the network, the outage is logged once and counted, and when Redis comes
// back on the same port pins flow again.
func TestRedisStoppedMidRun(t *testing.T) {
	r := redistest.Start(t)
	a, lb := open(t, r, Options{Timeout: 20 * time.Millisecond})
	b, _ := open(t, r, Options{})
	waitUp(t, a)
	waitUp(t, b)
	a.Put(link(1), "10.0.0.1:8000")
	eventually(t, 5*time.Second, "pin before the outage", func() bool { _, ok := b.Get(link(1)); return ok })

	r.Stop()
	before := a.Stats()
	const n = 2000
	var slowest time.Duration
	start := time.Now()
	for i := range n {
		t0 := time.Now()
		a.Put(link(100+i), "10.0.0.2:8000")
		if _, ok := a.Get(link(100 + i)); ok {
			t.Fatalf("read %d succeeded with Redis stopped", i)
		}
		slowest = max(slowest, time.Since(t0))
	}
	elapsed := time.Since(start)
	st := a.Stats()
	reads := st.Hits + st.Misses + st.ReadErrors + st.Skipped - (before.Hits + before.Misses + before.ReadErrors + before.Skipped)
	if reads != n {
		t.Errorf("%d reads counted, want %d", reads, n)
	}
	// At most a few reads went to the network (those before the store saw
	// the outage); the rest were skipped at once.
	if sent := st.ReadErrors - before.ReadErrors; sent > 5 {
		t.Errorf("%d reads failed on the network, want at most 5 (then skipped): %+v", sent, st)
	}
	if st.Up || st.Errors == 0 || st.Skipped-before.Skipped < n-5 {
		t.Errorf("stats while down: %+v", st)
	}
	t.Logf("%d Put+Get pairs with Redis stopped: %v, slowest %v", n, elapsed, slowest)
	// The bound is the read budget (20ms) with room for a loaded machine;
	// a call that waited on a dial or a retry would take seconds.
	if slowest > 500*time.Millisecond {
		t.Errorf("a call took %v with Redis stopped", slowest)
	}
	eventually(t, 5*time.Second, "outage logged", func() bool { return lb.count("pin store unreachable") == 1 })

	r.Start()
	waitUp(t, a)
	waitUp(t, b)
	a.Put(link(5000), "10.0.0.3:8000")
	eventually(t, 5*time.Second, "pin after Redis returned, seen by b", func() bool {
		v, ok := b.Get(link(5000))
		return ok && v == "10.0.0.3:8000"
	})
	if n := lb.count("pin store unreachable"); n != 1 {
		t.Errorf("outage logged %d times:\n%s", n, lb)
	}
	if n := lb.count("pin store reachable again"); n != 1 {
		t.Errorf("recovery logged %d times:\n%s", n, lb)
	}
}

// TestCloseFlushes: what is queued at Close is written; later calls are
// dropped or skipped, never blocked.
func TestCloseFlushes(t *testing.T) {
	r := redistest.Start(t)
	s, _ := open(t, r, Options{QueueSize: 4096})
	waitUp(t, s)
	for i := range 3000 {
		s.Put(link(i), "10.0.0.1:8000")
	}
	s.Close()
	st := s.Stats()
	if got := redistest.DoInt(t, r.Addr, "DBSIZE"); got != 3000 || st.Writes != 3000 || st.Dropped != 0 {
		t.Errorf("DBSIZE %d after Close, stats %+v", got, st)
	}
	s.Put(link(1), "x")
	if _, ok := s.Get(link(1)); ok {
		t.Error("read after Close")
	}
	s.Close() // twice is fine
}

// TestConcurrentUseAcrossOutage: goroutines read and write while Redis is
// killed and restarted; under -race this checks the store's state changes,
// and that no call blocks past the read budget's order of magnitude.
func TestConcurrentUseAcrossOutage(t *testing.T) {
	r := redistest.Start(t)
	s, lb := open(t, r, Options{Timeout: 20 * time.Millisecond, QueueSize: 256})
	waitUp(t, s)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var slowest atomic.Int64
	for g := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				t0 := time.Now()
				s.Put(link(g<<20|i), "10.0.0.1:8000")
				s.Get(link(g<<20 | i/2))
				if d := int64(time.Since(t0)); d > slowest.Load() {
					slowest.Store(d)
				}
				if i%64 == 0 {
					time.Sleep(100 * time.Microsecond) // leave the writer and Redis some of the two cores
				}
			}
		})
	}
	waitReads := func(n uint64) {
		st := s.Stats()
		from := st.Hits + st.Misses + st.ReadErrors + st.Skipped
		eventually(t, 10*time.Second, "reads go on", func() bool {
			st := s.Stats()
			return st.Hits+st.Misses+st.ReadErrors+st.Skipped >= from+n
		})
	}
	waitReads(500)
	r.Stop()
	eventually(t, 10*time.Second, "store down", func() bool { return !s.Up() })
	waitReads(500)
	r.Start()
	waitUp(t, s)
	waitReads(500)
	close(stop)
	wg.Wait()
	st := s.Stats()
	t.Logf("stats %+v, slowest Put+Get %v", st, time.Duration(slowest.Load()))
	if st.Writes == 0 || st.Hits == 0 || st.Skipped == 0 || st.Errors == 0 {
		t.Errorf("stats %+v", st)
	}
	if d := time.Duration(slowest.Load()); d > time.Second {
		t.Errorf("a Put+Get took %v", d)
	}
	if n := lb.count("pin store unreachable"); n != 1 {
		t.Errorf("outage logged %d times:\n%s", n, lb)
	}
}
