package tracing

import (
	"maps"
	"sync"
	"sync/atomic"
)

// Span names are "METHOD /path", as OpenTelemetry's HTTP conventions name
// a server span after its route. warmroute forwards paths it does not
// parse (a Responses API id, say), so the names it has made are kept in a
// table of at most maxNames: a request reuses its name without
// allocating, and past the bound, or for a path longer than maxNameLen, a
// span is named after its method alone, keeping the names few for the
// backends that index them.
const (
	maxNames   = 128
	maxNameLen = 96
)

// names is the table. Reads take no lock: the map is replaced whole, under
// mu, when a name is added, which happens at most maxNames times.
type names struct {
	mu    sync.Mutex
	table atomic.Pointer[map[string]string]
}

// get returns the name of method and path, and false when it is not in
// the table and cannot be added.
func (n *names) get(method, path []byte) (string, bool) {
	var buf [maxNameLen]byte
	if len(method)+1+len(path) > len(buf) {
		return "", false
	}
	key := append(append(append(buf[:0], method...), ' '), path...)
	if t := n.table.Load(); t != nil {
		if name, ok := (*t)[string(key)]; ok {
			return name, true
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	var old map[string]string
	if t := n.table.Load(); t != nil {
		old = *t
	}
	if name, ok := old[string(key)]; ok {
		return name, true
	}
	if len(old) >= maxNames {
		return "", false
	}
	t := make(map[string]string, len(old)+1)
	maps.Copy(t, old)
	name := string(key)
	t[name] = name
	n.table.Store(&t)
	return name, true
}

// methodName is the name of a span whose path is not in the table: the
// method, when it is one of HTTP's, and otherwise "HTTP", as the
// conventions ask.
func methodName(method []byte) string {
	for _, m := range httpMethods {
		if string(method) == m {
			return m
		}
	}
	return "HTTP"
}

var httpMethods = [...]string{"GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"}
