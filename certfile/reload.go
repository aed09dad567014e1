// Package certfile serves a TLS certificate from a certificate file and a
// key file that may be replaced while the process runs: a renewal, or a
// Kubernetes Secret's update. A handshake after the change gets the new
// certificate; a connection already open keeps the session it has, so
// nothing restarts and no connection drops.
package certfile

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Reloader holds the certificate read last from its pair of PEM files, for
// tls.Config.GetCertificate. The files are looked at from a handshake, at
// most once every interval: a request on an open connection, resumed or
// not, never reaches it, and a listener that nobody connects to reads
// nothing.
type Reloader struct {
	certFile, keyFile string
	every             time.Duration
	log               *slog.Logger

	cert atomic.Pointer[tls.Certificate]
	// next is when, in Unix nanoseconds, a handshake looks at the files
	// again; the handshake that moves it looks.
	next atomic.Int64

	mu sync.Mutex // one read of the files at a time
	// seen are the files as they were last read, nil for one that could
	// not be stat'ed.
	seen [2]os.FileInfo
}

// Load reads the certificate (with its chain, if the file holds one) and
// its key, and returns a Reloader that looks at the files again at most
// every interval (0: at every handshake) and reads them again when their
// size or time changed. A file missing or unreadable, one that is not PEM,
// or a key that does not match the certificate is an error.
func Load(certFile, keyFile string, every time.Duration, log *slog.Logger) (*Reloader, error) {
	r := &Reloader{certFile: certFile, keyFile: keyFile, every: every, log: log}
	if err := r.read(); err != nil {
		return nil, err
	}
	r.next.Store(time.Now().Add(every).UnixNano())
	return r, nil
}

// GetCertificate returns the certificate read last, after a look at the
// files if the last look is older than the interval. A change that cannot
// be read keeps the certificate that was served (read logs why).
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	now := time.Now().UnixNano()
	if next := r.next.Load(); now >= next && r.next.CompareAndSwap(next, now+int64(r.every)) {
		r.changed()
	}
	return r.cert.Load(), nil
}

// Reload reads the files now, changed or not (SIGHUP). On an error the
// certificate read before stays, and the error is logged and returned.
func (r *Reloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reload()
}

// changed reads the files again if either is another file than the one
// read last (a rename over it, a Secret's new directory), or its size or
// time changed.
func (r *Reloader) changed() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, fi := range r.stat() {
		if old := r.seen[i]; fi == nil || old == nil || !os.SameFile(fi, old) || fi.Size() != old.Size() || !fi.ModTime().Equal(old.ModTime()) {
			r.reload()
			return
		}
	}
}

// reload reads the files and logs the outcome. r.mu is held.
func (r *Reloader) reload() error {
	old := r.cert.Load()
	if err := r.read(); err != nil {
		r.log.Error("certificate not reloaded; the old one stays", "cert_file", r.certFile, "key_file", r.keyFile, "cause", err.Error(),
			"serving_until", old.Leaf.NotAfter)
		return err
	}
	leaf := r.cert.Load().Leaf
	r.log.Info("certificate reloaded", "cert_file", r.certFile, "subject", leaf.Subject.String(), "not_after", leaf.NotAfter)
	return nil
}

// read reads the pair into r.cert. The files are stat'ed before they are
// read, so that a write between the two is seen at the next look; what
// was seen is kept even when the read fails, so that a bad pair is logged
// once, and read again only when one of its files changes.
func (r *Reloader) read() error {
	r.seen = r.stat()
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("certificate %s with key %s: %w", r.certFile, r.keyFile, err)
	}
	if time.Now().After(cert.Leaf.NotAfter) {
		r.log.Warn("the certificate has expired", "cert_file", r.certFile, "not_after", cert.Leaf.NotAfter)
	}
	r.cert.Store(&cert)
	return nil
}

// stat returns the files' information, nil for one that cannot be
// stat'ed: a file briefly absent while it is replaced reads as a change.
func (r *Reloader) stat() (s [2]os.FileInfo) {
	for i, f := range [2]string{r.certFile, r.keyFile} {
		s[i], _ = os.Stat(f)
	}
	return s
}
