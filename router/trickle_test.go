package router

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/upstream"
)

// A replica that trickles a stream a byte at a time, each byte well inside
// -stream-idle-timeout, is cut once it has sent less than -stream-min-rate
// for that long, and counted as a mid-stream failure.
func TestTrickledStreamIsCutBelowTheMinimumRate(t *testing.T) {
	url := trickler(t, 10*time.Millisecond) // 100 bytes a second
	p := startProxy(t, Adaptive, []string{url}, func(u *upstream.Config, _ *Config, _ *ServerConfig) {
		u.StreamIdleTimeout, u.StreamMinRate = 200*time.Millisecond, 1000
	})
	c := dialProxy(t, p)
	io.WriteString(c, rawChat(chat(1, 1), ""))
	readCut(t, c)
	if got := p.metric(t, `warmroute_upstream_sends_total{replica="`+strings.TrimPrefix(url, "http://")+`",result="mid_stream"}`); got != "1" {
		t.Errorf("mid_stream sends = %q, want 1", got)
	}
	if !strings.Contains(p.logs.String(), upstream.ErrTooSlow.Error()) {
		t.Errorf("the cut's log line does not say that the replica was too slow")
	}
}
