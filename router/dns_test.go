package router

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// dnsServer is a DNS server on loopback that answers A queries for one
// name with the addresses the test sets, and nothing else: the resolver a
// Kubernetes headless Service would be, under the test's control.
type dnsServer struct {
	name  string // fully qualified, with the trailing dot
	mu    sync.Mutex
	addrs []netip.Addr
	conn  net.PacketConn
}

func startDNS(t *testing.T, name string, addrs ...string) *dnsServer {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &dnsServer{name: name + ".", conn: pc}
	s.set(addrs...)
	t.Cleanup(func() { pc.Close() })
	go s.serve()
	return s
}

func (s *dnsServer) set(addrs ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addrs = s.addrs[:0]
	for _, a := range addrs {
		s.addrs = append(s.addrs, netip.MustParseAddr(a))
	}
}

func (s *dnsServer) serve() {
	buf := make([]byte, 1500)
	for {
		n, from, err := s.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		var p dnsmessage.Parser
		hdr, err := p.Start(buf[:n])
		if err != nil {
			continue
		}
		q, err := p.Question()
		if err != nil {
			continue
		}
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: hdr.ID, Response: true, Authoritative: true})
		b.EnableCompression()
		b.StartQuestions()
		b.Question(q)
		b.StartAnswers()
		if strings.EqualFold(q.Name.String(), s.name) && q.Type == dnsmessage.TypeA {
			s.mu.Lock()
			for _, a := range s.addrs {
				b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 1}, dnsmessage.AResource{A: a.As4()})
			}
			s.mu.Unlock()
		}
		msg, err := b.Finish()
		if err == nil {
			s.conn.WriteTo(msg, from)
		}
	}
}

// resolver returns a Go resolver that asks only s.
func (s *dnsServer) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", s.conn.LocalAddr().String())
	}}
}
