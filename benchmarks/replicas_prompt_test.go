package benchmarks

import (
	"testing"

	"github.com/warmroute/warmroute/benchmarks/workload"
)

// TestPrepare checks what a request of the workloads becomes on its way
// to real replicas: their model, the run's salt opening the first message,
// ignore_eos; and that the simulator's requests go as they are.
func TestPrepare(t *testing.T) {
	msgs := []workload.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"}}
	body := string(workload.Body("sim-30b", msgs, true, 4))
	for _, c := range []struct {
		name string
		e    *env
		want string
	}{
		{"simulator", &env{}, body},
		{"salted", &env{real: true, model: "m", salt: "[run 1] "},
			`{"model":"m","messages":[{"role":"system","content":"[run 1] Be brief."},{"role":"user","content":"Hi"}],"stream":true,"max_tokens":4,"ignore_eos":true}`},
		{"engine reset", &env{real: true, model: "Qwen/Qwen3-8B"},
			`{"model":"Qwen/Qwen3-8B","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],"stream":true,"max_tokens":4,"ignore_eos":true}`},
	} {
		if got := string(c.e.prepare([]byte(body))); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got, c.want)
		}
	}
}

func TestScaled(t *testing.T) {
	for _, c := range []struct {
		s    string
		f    float64
		want string
	}{
		{"abcd", 1, "abcd"},
		{"abcd", 0.5, "ab"},
		{"abcd", 2.5, "abcdabcdab"},
		{"", 3, ""},
	} {
		if got := scaled(c.s, c.f); got != c.want {
			t.Errorf("scaled(%q, %g) = %q, want %q", c.s, c.f, got, c.want)
		}
	}
}
