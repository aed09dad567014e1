package benchmarks

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

var policyColors = map[string]string{"roundrobin": "#d62728", "affinity": "#ff7f0e", "adaptive": "#2ca02c"}

// writeReport writes bench-report.md and bench-chart.svg into dir: the
// table, how it was made, and a chart drawn here, with no network.
func writeReport(dir, tbl string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "bench-chart.svg"), []byte(chart()), 0o644); err != nil {
		return err
	}
	cpu := "unknown"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "model name") {
				cpu = strings.TrimSpace(strings.SplitN(line, ":", 2)[1])
				break
			}
		}
	}
	rev, _ := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	md := fmt.Sprintf(`# warmroute benchmark report

- date: %s
- machine: %s, %d CPUs, %s/%s, %s
- commit: %s
- command: scripts/bench-report.sh (go test -run '^$' -bench . -benchtime 1x ./benchmarks/ -sim-scale %g -report DIR)

Two simulated vLLM replicas (benchmarks/sim, DefaultConfig) behind a real
warmroute listener. Figures are in real-scale units: the replicas ran %g
times faster than real time, and TTFT and makespan come from the engine's
own clock, so host noise delays work but does not change them. The seed's
column is 000_4a3618ba74b647f4.txt.

%s
![per-turn TTFT of one agent loop, and cold-burst makespan](bench-chart.svg)
`, time.Now().UTC().Format("2006-01-02 15:04 MST"), cpu, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version(),
		strings.TrimSpace(string(rev)), *simScale, *simScale, tbl)
	return os.WriteFile(filepath.Join(dir, "bench-report.md"), []byte(md), 0o644)
}

// chart draws per-turn TTFT of the agent loop under each policy (left) and
// the cold-burst makespan per policy (right).
func chart() string {
	results.Lock()
	defer results.Unlock()
	const w, h, pad = 960, 400, 50
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, h)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	// Left: TTFT per turn, log scale from 100 ms to 100 s.
	lw := 600
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14">Agent loop: TTFT per turn (ms, log scale)</text>`+"\n", pad)
	ylog := func(ms float64) float64 {
		if ms < 100 {
			ms = 100
		}
		return float64(h-pad) - (logf(ms)-2)/3*float64(h-2*pad)
	}
	for _, v := range []float64{100, 1000, 10000, 100000} {
		y := ylog(v)
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="5" y="%.1f">%g</text>`+"\n", pad, lw, y, y, y+4, v)
	}
	maxTurns := 1
	for _, v := range results.perTurn {
		maxTurns = max(maxTurns, len(v))
	}
	legend := 0
	for _, p := range sortedPolicies() {
		v := results.perTurn[p]
		var pts []string
		for i, ms := range v {
			x := float64(pad) + float64(i)/float64(max(maxTurns-1, 1))*float64(lw-pad)
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, ylog(ms)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", policyColors[p], strings.Join(pts, " "))
		fmt.Fprintf(&b, `<text x="%d" y="%d" fill="%s">%s</text>`+"\n", lw-90, 45+legend*16, policyColors[p], p)
		legend++
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d">turn</text>`+"\n", (lw+pad)/2, h-15)
	// Right: burst makespan bars.
	x0 := lw + 60
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14">Cold burst of 16: makespan (s)</text>`+"\n", x0)
	maxS := 1.0
	for _, p := range []string{"roundrobin", "affinity", "adaptive"} {
		maxS = max(maxS, results.m["burst/"+p])
	}
	for i, p := range []string{"roundrobin", "affinity", "adaptive"} {
		s, ok := results.m["burst/"+p]
		if !ok {
			continue
		}
		bh := s / maxS * float64(h-2*pad-20)
		x := x0 + 10 + i*85
		fmt.Fprintf(&b, `<rect x="%d" y="%.1f" width="60" height="%.1f" fill="%s"/>`+"\n", x, float64(h-pad)-bh, bh, policyColors[p])
		fmt.Fprintf(&b, `<text x="%d" y="%.1f">%.1f</text><text x="%d" y="%d">%s</text>`+"\n", x+10, float64(h-pad)-bh-5, s, x, h-pad+15, p)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func logf(v float64) float64 {
	l := 0.0
	for v >= 10 {
		v /= 10
		l++
	}
	// linear within a decade is close enough for a chart
	return l + (v-1)/9
}
