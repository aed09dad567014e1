package upstream

import (
	"runtime"
	"testing"
)

// untilReadable returns once c's socket holds a byte to read: the kernel
// has what the other end wrote.
func untilReadable(t *testing.T, c *Conn) {
	t.Helper()
	for {
		var readable bool
		c.rc.Control(func(fd uintptr) {
			_, err := peekByte(fd, &c.peekBuf)
			readable = err == nil
		})
		if readable {
			return
		}
		runtime.Gosched()
	}
}
