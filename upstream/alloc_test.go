//go:build linux && !race

package upstream

import "testing"

// A wait polls its client every poll interval: with thousands of long
// prefills waiting, the poll must leave no garbage.
func TestPeerClosedAllocatesNothing(t *testing.T) {
	t.Skip("bug: PeerClosed allocates 5 times a call (SyscallConn's raw conn, the peek's closure and what it captures), " +
		"once a poll interval for every request that waits or streams past its first poll")
	held, _ := clientPair(t)
	if n := testing.AllocsPerRun(100, func() {
		if PeerClosed(held) {
			t.Fatal("PeerClosed of a client that is there")
		}
	}); n != 0 {
		t.Errorf("PeerClosed(%T) allocates %.1f times, want 0", held, n)
	}
}
