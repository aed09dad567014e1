package upstream

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/warmroute/warmroute/prefixcache"
)

// A replica's model list is what its last readable answer said: a list,
// or, for a 404, 405 or a list with no ids, every model. An answer that
// could not be used (an error status, JSON that is not a list) keeps the
// list it had.
func TestFetchModels(t *testing.T) {
	var (
		mu     sync.Mutex
		status int
		body   string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.WriteHeader(status)
		io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	s, err := NewSet([]string{srv.URL}, Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	r := s.Replica(0)
	for _, c := range []struct {
		status int
		body   string
		want   string // the names listed; "" for every model
	}{
		{200, `{"object":"list","data":[{"id":"a"},{"id":"b"}]}`, "a,b"},
		{500, `{"error":"busy"}`, "a,b"},
		{200, `not json`, "a,b"},
		{404, ``, ""},
		{200, `{"data":[{"id":"c"}]}`, "c"},
		{503, ``, "c"},
		{405, ``, ""},
		{200, `{"data":[{"id":"c"}]}`, "c"},
		{200, `{"data":[]}`, ""},
	} {
		mu.Lock()
		status, body = c.status, c.body
		mu.Unlock()
		r.fetchModels(context.Background(), http.DefaultClient)
		if got := strings.Join(s.ModelNames(), ","); got != c.want {
			t.Fatalf("after %d %s: lists %q, want %q", c.status, c.body, got, c.want)
		}
		if every := s.ModelMask(prefixcache.ModelKey("unlisted")).Has(0); every != (c.want == "") {
			t.Fatalf("after %d %s: serves an unlisted model: %v", c.status, c.body, every)
		}
	}
}
