//go:build linux && !race

package upstream

import "testing"

// A wait polls its client every poll interval: with thousands of long
// prefills waiting, the poll must leave no garbage once it has the
// client's socket.
func TestClientGoneAllocatesNothing(t *testing.T) {
	held, _ := clientPair(t)
	c := &Conn{}
	c.clientGone(held)
	if n := testing.AllocsPerRun(100, func() {
		if c.clientGone(held) {
			t.Fatal("clientGone of a client that is there")
		}
	}); n != 0 {
		t.Errorf("clientGone(%T) allocates %.1f times, want 0", held, n)
	}
}
