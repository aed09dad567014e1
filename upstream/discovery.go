package upstream

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Discovery finds the replicas instead of a fixed list: the addresses of a
// DNS name (a Kubernetes headless Service publishes one A or AAAA record
// per ready pod), the targets of an SRV name, and the base URLs in a file.
// The set follows them: a replica that appears joins after its first good
// probe, one that disappears takes no new request and finishes the ones it
// has. A lookup or a read that fails keeps the set as it is.
type Discovery struct {
	// DNS is name:port; each address of name is a replica at port.
	// Prefixed with https://, the replicas are served over TLS.
	DNS string
	// SRV is a full SRV name (_http._tcp.vllm.default.svc.cluster.local);
	// each target is a replica at its port. Prefixed with https://, the
	// replicas are served over TLS.
	SRV string
	// File holds one base URL per line; blank lines and # comments are
	// skipped.
	File string
	// Interval is the time between lookups (default 5s). The file is
	// looked at every second and read again when it changed.
	Interval time.Duration
	// Resolver resolves the names; nil means the system's. Tests point it
	// at a DNS server of their own.
	Resolver *net.Resolver
	// LookupIP and LookupSRV, when set, resolve instead of Resolver.
	LookupIP  func(ctx context.Context, host string) ([]netip.Addr, error)
	LookupSRV func(ctx context.Context, name string) ([]*net.SRV, error)

	fileStamp string // size and time of the file as last read
}

// Enabled reports whether any source is set.
func (d *Discovery) Enabled() bool { return d.DNS != "" || d.SRV != "" || d.File != "" }

// Check reports a source that cannot work, for a clear error at startup.
func (d *Discovery) Check() error {
	if d.DNS != "" {
		_, name := splitScheme(d.DNS)
		host, port, err := net.SplitHostPort(name)
		if p, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || p < 1 || p > 65535 {
			return fmt.Errorf("-upstream-dns %q: want name:port, e.g. vllm.default.svc.cluster.local:8000", d.DNS)
		}
	}
	return nil
}

// Resolve returns the base URLs that the sources name now, sorted.
func (d *Discovery) Resolve(ctx context.Context) ([]string, error) {
	var urls []string
	if d.DNS != "" {
		scheme, name := splitScheme(d.DNS)
		host, port, _ := net.SplitHostPort(name)
		lookup := d.LookupIP
		if lookup == nil {
			lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
				return d.resolver().LookupNetIP(ctx, "ip", host)
			}
		}
		addrs, err := lookup(ctx, host)
		if err != nil {
			return nil, fmt.Errorf("-upstream-dns %s: %w", d.DNS, err)
		}
		for _, a := range addrs {
			urls = append(urls, scheme+net.JoinHostPort(a.Unmap().String(), port))
		}
	}
	if d.SRV != "" {
		scheme, name := splitScheme(d.SRV)
		lookup := d.LookupSRV
		if lookup == nil {
			lookup = func(ctx context.Context, name string) ([]*net.SRV, error) {
				_, srvs, err := d.resolver().LookupSRV(ctx, "", "", name)
				return srvs, err
			}
		}
		srvs, err := lookup(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("-upstream-srv %s: %w", d.SRV, err)
		}
		for _, s := range srvs {
			urls = append(urls, scheme+net.JoinHostPort(strings.TrimSuffix(s.Target, "."), strconv.Itoa(int(s.Port))))
		}
	}
	if d.File != "" {
		b, err := os.ReadFile(d.File)
		if err != nil {
			return nil, fmt.Errorf("-upstream-file: %w", err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				urls = append(urls, line)
			}
		}
	}
	sort.Strings(urls)
	return urls, nil
}

// splitScheme splits the https:// of a DNS or SRV source off its name.
func splitScheme(source string) (scheme, name string) {
	if name, ok := strings.CutPrefix(source, "https://"); ok {
		return "https://", name
	}
	return "http://", source
}

func (d *Discovery) resolver() *net.Resolver {
	if d.Resolver != nil {
		return d.Resolver
	}
	return net.DefaultResolver
}

// fileChanged reports whether the file's size or time changed since the
// last call.
func (d *Discovery) fileChanged() bool {
	fi, err := os.Stat(d.File)
	if err != nil {
		return false
	}
	stamp := strconv.FormatInt(fi.Size(), 10) + "@" + fi.ModTime().String()
	changed := stamp != d.fileStamp
	d.fileStamp = stamp
	return changed
}

// Discover makes s follow d until ctx ends: a lookup every d.Interval, the
// file whenever it changes, and both at once on reload (SIGHUP). It
// returns at once.
func (s *Set) Discover(ctx context.Context, d *Discovery, reload <-chan struct{}) {
	if d.Interval <= 0 {
		d.Interval = 5 * time.Second
	}
	if d.File != "" {
		d.fileChanged() // the first read was the start's
	}
	apply := func(why string) {
		lctx, cancel := context.WithTimeout(ctx, max(d.Interval, time.Second))
		urls, err := d.Resolve(lctx)
		cancel()
		if err != nil {
			s.cfg.Logger.Warn("discovery failed; the replicas stay as they are", "cause", err.Error())
			return
		}
		for _, err := range s.Reconcile(urls) {
			s.cfg.Logger.Warn("discovery: replica not added", "cause", err.Error(), "on", why)
		}
	}
	go func() {
		lookups := time.NewTicker(d.Interval)
		defer lookups.Stop()
		files := time.NewTicker(time.Second)
		defer files.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-reload:
				d.fileChanged()
				apply("reload")
			case <-lookups.C:
				if d.DNS != "" || d.SRV != "" {
					apply("lookup")
				}
			case <-files.C:
				if d.File != "" && d.fileChanged() {
					apply("file change")
				}
			}
		}
	}()
}

// StartDiscovered returns a set of the replicas that d finds now, every one
// live, as NewSet does for a fixed list.
func StartDiscovered(ctx context.Context, d *Discovery, cfg Config) (*Set, error) {
	if err := d.Check(); err != nil {
		return nil, err
	}
	urls, err := d.Resolve(ctx)
	if err != nil {
		return nil, err
	}
	s := NewEmptySet(cfg)
	for _, u := range urls {
		if _, err := s.Add(u, Live); err != nil {
			return nil, err
		}
	}
	if len(urls) == 0 {
		s.cfg.Logger.Warn("discovery found no replica yet; requests get 503 until one joins")
	}
	return s, nil
}
