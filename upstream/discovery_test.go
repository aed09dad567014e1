package upstream

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Each source gives base URLs: a DNS name's addresses at its port, an SRV
// name's targets at theirs, a file's lines; a failed lookup is an error,
// never an empty set.
func TestDiscoveryResolve(t *testing.T) {
	file := filepath.Join(t.TempDir(), "replicas")
	os.WriteFile(file, []byte("# GPU host 1\nhttp://10.0.0.9:8000\n\n10.0.0.8:8001\n"), 0o600)
	d := &Discovery{
		DNS:  "vllm.default.svc:8000",
		SRV:  "_http._tcp.sglang.default.svc",
		File: file,
		LookupIP: func(_ context.Context, host string) ([]netip.Addr, error) {
			if host != "vllm.default.svc" {
				return nil, errors.New("wrong host " + host)
			}
			return []netip.Addr{netip.MustParseAddr("10.1.0.2"), netip.MustParseAddr("::ffff:10.1.0.3"), netip.MustParseAddr("fd00::7")}, nil
		},
		LookupSRV: func(_ context.Context, name string) ([]*net.SRV, error) {
			return []*net.SRV{{Target: "sglang-0.sglang.default.svc.", Port: 30000}}, nil
		},
	}
	urls, err := d.Resolve(context.Background())
	want := "10.0.0.8:8001 http://10.0.0.9:8000 http://10.1.0.2:8000 http://10.1.0.3:8000 http://[fd00::7]:8000 http://sglang-0.sglang.default.svc:30000"
	if err != nil || strings.Join(urls, " ") != want {
		t.Fatalf("Resolve = %q, %v; want %s", urls, err, want)
	}
	d.LookupIP = func(context.Context, string) ([]netip.Addr, error) { return nil, errors.New("SERVFAIL") }
	if urls, err := d.Resolve(context.Background()); err == nil || urls != nil {
		t.Fatalf("a failed lookup gave %q, %v", urls, err)
	}
	// Prefixed with https://, the replicas found are served over TLS.
	d = &Discovery{DNS: "https://vllm.default.svc:8443", SRV: "https://_https._tcp.sglang.default.svc", LookupSRV: func(_ context.Context, name string) ([]*net.SRV, error) {
		if name != "_https._tcp.sglang.default.svc" {
			return nil, errors.New("wrong name " + name)
		}
		return []*net.SRV{{Target: "sglang-0.sglang.default.svc.", Port: 30443}}, nil
	}}
	d.LookupIP = func(_ context.Context, host string) ([]netip.Addr, error) {
		if host != "vllm.default.svc" {
			return nil, errors.New("wrong host " + host)
		}
		return []netip.Addr{netip.MustParseAddr("10.1.0.2")}, nil
	}
	if err := d.Check(); err != nil {
		t.Fatal(err)
	}
	urls, err = d.Resolve(context.Background())
	if want := "https://10.1.0.2:8443 https://sglang-0.sglang.default.svc:30443"; err != nil || strings.Join(urls, " ") != want {
		t.Fatalf("Resolve = %q, %v; want %s", urls, err, want)
	}
	for _, bad := range []string{"vllm", "vllm:port", ":8000", "vllm:0", "https://vllm"} {
		if err := (&Discovery{DNS: bad}).Check(); err == nil {
			t.Errorf("-upstream-dns %q passed the check", bad)
		}
	}
}

// Reconcile adds what is new as joining, removes what is gone, and keeps
// the rest where it is.
func TestReconcile(t *testing.T) {
	s, err := NewSet([]string{"10.0.0.1:8000", "10.0.0.2:8000"}, Config{})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	s.Observe(Observer{Leave: func(r *Replica) { left = append(left, r.Name) }})
	kept := s.Replica(1)
	if errs := s.Reconcile([]string{"http://10.0.0.2:8000", "10.0.0.3:8000", "bad url"}); len(errs) != 1 {
		t.Fatalf("errors %v, want one for the bad URL", errs)
	}
	if s.Replica(1) != kept || kept.State() != Live {
		t.Fatal("a replica still listed moved or changed")
	}
	if strings.Join(left, ",") != "10.0.0.1:8000" {
		t.Fatalf("left: %v, want the replica no longer listed", left)
	}
	// The new replica takes the slot that the one that left gave back.
	if r := s.Replica(0); r == nil || r.Name != "10.0.0.3:8000" || r.State() != Joining {
		t.Fatalf("the new replica: %v", r)
	}
	if s.LiveMask() != (Mask{1 << 1}) {
		t.Fatalf("live mask %b, want only the kept replica until the new one's probe", s.LiveMask())
	}
	if _, err := s.Add("10.0.0.2:8000", Live); err == nil {
		t.Fatal("a replica already in the set was added twice")
	}
}
