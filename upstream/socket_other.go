//go:build !linux

package upstream

import (
	"io"
	"net"
)

// Elsewhere than Linux the proxy reads no socket state of its own: a pooled
// connection is trusted until a request on it fails, an end of stream
// before the answer is never proof that the request went unread (so it is
// answered 502, the conservative side), and a client that leaves is found
// when a write to it fails.

func (c *Conn) alive() bool         { return true }
func (c *Conn) peek(fd uintptr)     {}
func (c *Conn) pendingError() error { return nil }
func (c *Conn) unacked() bool       { return false }
func (c *Conn) answered() bool      { return false }

// waitFunc returns nil: a wait holds its read buffer.
func (c *Conn) waitFunc() func(fd uintptr) bool { return nil }

// readSocket is not used here (waitFunc).
func readSocket(fd uintptr, p []byte) (int, error) { return 0, io.EOF }

// writeSocket is not used here (waitFunc).
func writeSocket(fd uintptr, p []byte) (int, error) { return 0, io.EOF }

// clientGone reports false: without a non-blocking peek the proxy cannot
// tell that a client left while it waits.
func (c *Conn) clientGone(client net.Conn) bool { return false }
