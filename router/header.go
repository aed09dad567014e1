package router

import (
	"bytes"
	"net"
	"net/netip"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/upstream"
)

// hopByHop are the headers that describe one connection, not the message
// (RFC 9110 §7.6.1), plus the ones the proxy rewrites: Host names the
// replica, Content-Length is recomputed, Expect was answered already, and
// X-Forwarded-For is extended.
var hopByHop = newNames("Connection", "Keep-Alive", "Proxy-Connection",
	"Proxy-Authenticate", "Proxy-Authorization", "Te",
	"Trailer", "Transfer-Encoding", "Upgrade",
	"Host", "Content-Length", "Expect", "X-Forwarded-For")

// responseHopByHop are removed from a replica's response, with every header
// that its Connection header names (RFC 9110 §7.6.1); fasthttp writes its
// own framing and connection headers. Trailer is kept: trailers are relayed.
var responseHopByHop = newNames("Connection", "Keep-Alive", "Proxy-Connection",
	"Proxy-Authenticate", "Te", "Upgrade")

// dropResponseHopByHop removes the hop-by-hop headers of a replica's
// response. One pass looks for any, so that the common response, which has
// none, costs no deletion.
func dropResponseHopByHop(h *fasthttp.ResponseHeader) {
	found := false
	for k := range h.All() {
		if responseHopByHop.has(k) {
			found = true
			break
		}
	}
	if !found {
		return
	}
	// A copy: deleting headers moves the bytes that Peek returned.
	var buf [128]byte
	list := append(buf[:0], h.PeekBytes(headConnection)...)
	for len(list) > 0 {
		var item []byte
		if item, list = nextToken(list); len(item) > 0 && !framing.has(item) {
			h.DelBytes(item)
		}
	}
	for _, k := range responseHopByHop.list {
		h.DelBytes(k)
	}
}

// credentials are the client's API key headers, kept from the replicas with
// -strip-authorization.
var credentials = newNames("Authorization", "X-Api-Key")

// framing are the headers that delimit the body the proxy relays: a
// Connection header that names one does not remove it.
var framing = newNames("Content-Length", "Transfer-Encoding", "Trailer")

// names is a set of header names, matched without regard to case. Every
// header of every request and answer is looked up in one or two of them,
// so they are sorted by length: most headers have a length that no name
// in the set has, and are turned away by one load.
type names struct {
	list     [][]byte
	byLength [maxNameLen + 1][][]byte
}

const maxNameLen = 32

func newNames(list ...string) *names {
	n := &names{}
	for _, name := range list {
		if len(name) > maxNameLen {
			panic("header name longer than maxNameLen: " + name)
		}
		n.list = append(n.list, []byte(name))
		n.byLength[len(name)] = append(n.byLength[len(name)], []byte(name))
	}
	return n
}

func (n *names) has(key []byte) bool {
	if len(key) > maxNameLen {
		return false
	}
	for _, name := range n.byLength[len(key)] {
		if bytes.EqualFold(name, key) {
			return true
		}
	}
	return false
}

func isHopByHop(key, connection []byte) bool {
	return hopByHop.has(key) || len(connection) > 0 && hasToken(connection, key)
}

// nextToken splits the first item, trimmed, off a comma-separated list.
func nextToken(list []byte) (item, rest []byte) {
	if i := bytes.IndexByte(list, ','); i >= 0 {
		return bytes.TrimSpace(list[:i]), list[i+1:]
	}
	return bytes.TrimSpace(list), nil
}

// hasToken reports whether the comma-separated list holds tok, ignoring case:
// a header that the Connection header names is hop-by-hop too.
func hasToken(list, tok []byte) bool {
	for len(list) > 0 {
		var item []byte
		if item, list = nextToken(list); bytes.EqualFold(item, tok) {
			return true
		}
	}
	return false
}

var (
	strHTTP11      = []byte(" HTTP/1.1\r\nHost: ")
	strCRLF        = []byte("\r\n")
	strColonSpace  = []byte(": ")
	strXFF         = []byte("X-Forwarded-For: ")
	strXFFName     = strXFF[:len("X-Forwarded-For")]
	strCommaSpace  = []byte(", ")
	strContentLen  = []byte("Content-Length: ")
	headConnection = []byte("Connection")
)

// appendRequestHead appends the HTTP/1.1 request head that forwards req to
// r: the request line, Host for r, every end-to-end
// header as received, X-Forwarded-For extended with the client's address,
// and the body's length.
func appendRequestHead(dst []byte, req *fasthttp.Request, r *upstream.Replica, client net.Addr, bodyLen int, stripAuth bool) []byte {
	h := &req.Header
	dst = append(dst, h.Method()...)
	dst = append(dst, ' ')
	dst = append(dst, h.RequestURI()...)
	dst = append(dst, strHTTP11...)
	dst = append(dst, r.Host()...)
	dst = append(dst, strCRLF...)
	// The name is canonical, as fasthttp keeps the names it parsed: no
	// copy to normalize first, as PeekBytes makes.
	connection := h.PeekCanonical(headConnection)
	// The first X-Forwarded-For, found in this pass rather than by a Peek,
	// which would search the headers again.
	var prior []byte
	for k, v := range h.All() {
		if isHopByHop(k, connection) || stripAuth && credentials.has(k) {
			if prior == nil && len(k) == len(strXFFName) && bytes.EqualFold(k, strXFFName) {
				prior = v
			}
			continue
		}
		dst = append(dst, k...)
		dst = append(dst, strColonSpace...)
		dst = append(dst, v...)
		dst = append(dst, strCRLF...)
	}
	dst = append(dst, strXFF...)
	if len(prior) > 0 {
		dst = append(dst, prior...)
		dst = append(dst, strCommaSpace...)
	}
	dst = appendIP(dst, client)
	dst = append(dst, strCRLF...)
	if bodyLen > 0 || h.IsPost() || h.IsPut() || h.IsPatch() {
		dst = append(dst, strContentLen...)
		dst = strconv.AppendInt(dst, int64(bodyLen), 10)
		dst = append(dst, strCRLF...)
	}
	return append(dst, strCRLF...)
}

func appendIP(dst []byte, a net.Addr) []byte {
	if ta, ok := a.(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(ta.IP); ok {
			return ip.Unmap().AppendTo(dst)
		}
	}
	return append(dst, "unknown"...)
}
