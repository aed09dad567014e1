package benchmarks

import (
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

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

%s simulated vLLM replicas (benchmarks/sim, DefaultConfig) behind a real
warmroute listener. Figures are in real-scale units: the replicas ran %g
times faster than real time, and TTFT and makespan come from the engine's
own clock, so host noise delays work but does not change them. The seed
column holds the reference figures that the simulator is calibrated to.

%s
![per-turn TTFT of one agent loop, and cold-burst makespan](bench-chart.svg)
`, time.Now().UTC().Format("2006-01-02 15:04 MST"), cpu, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version(),
		strings.TrimSpace(string(rev)), *simScale, replicasRun(), *simScale, tbl)
	return os.WriteFile(filepath.Join(dir, "bench-report.md"), []byte(md), 0o644)
}

// replicasRun says how many simulated replicas the agent loop ran on.
func replicasRun() string {
	results.Lock()
	defer results.Unlock()
	if n, ok := results.m["agent/replicas"]; ok {
		return fmt.Sprintf("%g", n)
	}
	return "The"
}

// chartData is what the chart shows: each policy's per-turn TTFT of the
// agent loop (ms) and cold-burst makespan (s), and what they ran on.
type chartData struct {
	perTurn  map[string][]float64
	burst    map[string]float64
	replicas int     // simulated replicas behind the proxy; 0 if unknown
	scale    float64 // how many times faster than real time they ran
}

// chart draws the chart of what the benchmarks recorded.
func chart() string {
	results.Lock()
	defer results.Unlock()
	d := chartData{perTurn: results.perTurn, burst: map[string]float64{}, scale: *simScale}
	for k, v := range results.m {
		if p, ok := strings.CutPrefix(k, "burst/"); ok {
			d.burst[p] = v
		}
	}
	if n, ok := results.m["agent/replicas"]; ok {
		d.replicas, d.scale = int(n), results.m["agent/scale"]
	}
	return drawChart(d)
}

// policyColors keep the seed's three policies' colours from report to
// report; any other policy takes the next of chartPalette.
var (
	policyColors = map[string]string{"roundrobin": "#d62728", "affinity": "#ff7f0e", "adaptive": "#2ca02c"}
	chartPalette = []string{"#1f77b4", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"}
	// Each policy's line has its own dash pattern and marker, so that
	// lines that overlap (two policies that pin alike) stay visible.
	chartDashes  = []string{"", "9 4", "2 3", "12 3 2 3", "5 5", "1 6", "16 4 4 4"}
	chartMarkers = []string{"circle", "square", "triangle", "diamond", "cross", "invtriangle", "plus"}
)

// chartOrder lists the policies that have data, the seed's three first in
// their usual order, then the rest by name.
func chartOrder(d chartData) []string {
	seen := map[string]bool{}
	for p := range d.perTurn {
		seen[p] = true
	}
	for p := range d.burst {
		seen[p] = true
	}
	var out, rest []string
	for _, p := range []string{"roundrobin", "affinity", "adaptive"} {
		if seen[p] {
			out = append(out, p)
			delete(seen, p)
		}
	}
	for p := range seen {
		rest = append(rest, p)
	}
	sort.Strings(rest)
	return append(out, rest...)
}

// logTicks returns the 1-2-5 values from lo to hi.
func logTicks(lo, hi float64) []float64 {
	var out []float64
	for d := math.Pow(10, math.Floor(math.Log10(lo))); d <= hi*1.0001; d *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if v := d * m; v >= lo*0.9999 && v <= hi*1.0001 {
				out = append(out, v)
			}
		}
	}
	return out
}

// step125 returns the 1-2-5 value next to v: the one at or below it, or
// with up the one at or above it.
func step125(v float64, up bool) float64 {
	d := math.Pow(10, math.Floor(math.Log10(v)))
	steps := []float64{1, 2, 5, 10}
	if up {
		for _, m := range steps {
			if d*m >= v*0.9999 {
				return d * m
			}
		}
	}
	for i := len(steps) - 1; i >= 0; i-- {
		if d*steps[i] <= v*1.0001 {
			return d * steps[i]
		}
	}
	return d
}

// drawChart draws per-turn TTFT of the agent loop under each policy (left,
// on a log10 axis with gridlines at 1-2-5 steps) and the cold-burst
// makespan per policy (right), with a caption that says what ran.
func drawChart(d chartData) string {
	const w, h = 1000, 470
	const left, right, top, bottom = 70, 620, 50, 380 // the TTFT plot's frame
	order := chartOrder(d)
	style := map[string]int{}
	for i, p := range order {
		style[p] = i
	}
	color := func(p string) string {
		if c, ok := policyColors[p]; ok {
			return c
		}
		return chartPalette[style[p]%len(chartPalette)]
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, h)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="14">Agent loop: time to first token per turn (ms, log scale)</text>`+"\n", left)

	// The y axis spans the 1-2-5 steps around the data: log10 maps a
	// value to its height, so that equal ratios are equal distances.
	lo, hi := 100.0, 100000.0
	if vmin, vmax := minMax(d.perTurn); vmax > 0 {
		lo, hi = step125(vmin, false), step125(vmax, true)
		if hi <= lo {
			hi = step125(lo*1.01, true)
		}
	}
	yOf := func(ms float64) float64 {
		ms = min(max(ms, lo), hi)
		return bottom - (math.Log10(ms)-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))*(bottom-top)
	}
	for _, v := range logTicks(lo, hi) {
		y := yOf(v)
		stroke := "#eee"
		if m := v / math.Pow(10, math.Floor(math.Log10(v)+1e-9)); m < 1.5 {
			stroke = "#bbb" // a decade
		}
		fmt.Fprintf(&b, `<line class="ygrid" data-v="%g" x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="%s"/>`, v, left, right, y, y, stroke)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%g</text>`+"\n", left-6, y+4, v)
	}

	// The x axis: turn 1 (the cold prefill of the whole context) to the
	// last, each numbered.
	maxTurns := 1
	for _, v := range d.perTurn {
		maxTurns = max(maxTurns, len(v))
	}
	xOf := func(i int) float64 {
		if maxTurns == 1 {
			return (left + right) / 2
		}
		return left + 10 + float64(i)/float64(maxTurns-1)*(right-left-20)
	}
	every := 1
	if maxTurns > 30 {
		every = (maxTurns + 29) / 30
	}
	fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#888"/>`+"\n", left, right, bottom, bottom)
	for i := 0; i < maxTurns; i++ {
		x := xOf(i)
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#888"/>`, x, x, bottom, bottom+4)
		if i%every == 0 || i == maxTurns-1 {
			fmt.Fprintf(&b, `<text class="xtick" x="%.1f" y="%d" text-anchor="middle">%d</text>`, x, bottom+17, i+1)
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">turn (1: the cold prefill of the whole context)</text>`+"\n", (left+right)/2, bottom+34)

	legend := 0
	for _, p := range order {
		v := d.perTurn[p]
		if len(v) == 0 {
			continue
		}
		i := style[p]
		dash, marker, c := chartDashes[i%len(chartDashes)], chartMarkers[i%len(chartMarkers)], color(p)
		dashAttr := ""
		if dash != "" {
			dashAttr = ` stroke-dasharray="` + dash + `"`
		}
		var pts []string
		for t, ms := range v {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xOf(t), yOf(ms)))
		}
		fmt.Fprintf(&b, `<polyline class="turns" data-policy="%s" fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", p, c, dashAttr, strings.Join(pts, " "))
		for t, ms := range v {
			b.WriteString(markerSVG(marker, xOf(t), yOf(ms), c))
		}
		b.WriteString("\n")
		// The legend: a sample of the line with its marker.
		ly := float64(top + 12 + legend*18)
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="2"%s/>`, right-150, right-110, ly, ly, c, dashAttr)
		b.WriteString(markerSVG(marker, float64(right-130), ly, c))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f">%s</text>`+"\n", right-102, ly+4, p)
		legend++
	}

	// Right: burst makespan bars, one per policy with data.
	x0 := right + 70
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="14">Cold burst: makespan (s)</text>`+"\n", x0)
	maxS := 1.0
	var bars []string
	for _, p := range order {
		if s, ok := d.burst[p]; ok {
			maxS = max(maxS, s)
			bars = append(bars, p)
		}
	}
	bw := 60.0
	if len(bars) > 0 {
		bw = min(60, float64(w-x0-20)/float64(len(bars))-10)
	}
	fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#888"/>`+"\n", x0, w-10, bottom, bottom)
	for i, p := range bars {
		s := d.burst[p]
		bh := s / maxS * float64(bottom-top-20)
		x := float64(x0) + 5 + float64(i)*(bw+10)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`, x, bottom-bh, bw, bh, color(p))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%.1f</text>`, x+bw/2, bottom-bh-5, s)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="end" transform="rotate(-35 %.1f %d)">%s</text>`+"\n", x+bw/2+4, bottom+14, x+bw/2+4, bottom+14, p)
	}

	// The caption: these are simulated replicas, how many, how fast.
	what := "simulated replicas"
	if d.replicas > 0 {
		what = fmt.Sprintf("%d simulated vLLM replica%s", d.replicas, map[bool]string{true: "s", false: ""}[d.replicas != 1])
	}
	fmt.Fprintf(&b, `<text class="caption" x="10" y="%d" fill="#444">%s (benchmarks/sim, DefaultConfig) behind one warmroute listener; no GPU.</text>`+"\n", h-30, what)
	fmt.Fprintf(&b, `<text class="caption" x="10" y="%d" fill="#444">They ran %g times faster than real time; every figure is in real-scale units, from the engines' own clocks.</text>`+"\n", h-12, d.scale)
	b.WriteString("</svg>\n")
	return b.String()
}

// markerSVG draws one point's marker.
func markerSVG(kind string, x, y float64, c string) string {
	const r = 3.5
	switch kind {
	case "square":
		return fmt.Sprintf(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`, x-r, y-r, 2*r, 2*r, c)
	case "triangle":
		return fmt.Sprintf(`<polygon points="%.1f,%.1f %.1f,%.1f %.1f,%.1f" fill="%s"/>`, x, y-r-1, x-r-1, y+r, x+r+1, y+r, c)
	case "invtriangle":
		return fmt.Sprintf(`<polygon points="%.1f,%.1f %.1f,%.1f %.1f,%.1f" fill="white" stroke="%s"/>`, x, y+r+1, x-r-1, y-r, x+r+1, y-r, c)
	case "diamond":
		return fmt.Sprintf(`<polygon points="%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f" fill="white" stroke="%s" stroke-width="1.5"/>`, x, y-r-1, x+r+1, y, x, y+r+1, x-r-1, y, c)
	case "cross":
		return fmt.Sprintf(`<path d="M%.1f %.1fL%.1f %.1fM%.1f %.1fL%.1f %.1f" stroke="%s" stroke-width="2"/>`, x-r, y-r, x+r, y+r, x-r, y+r, x+r, y-r, c)
	case "plus":
		return fmt.Sprintf(`<path d="M%.1f %.1fL%.1f %.1fM%.1f %.1fL%.1f %.1f" stroke="%s" stroke-width="2"/>`, x-r-1, y, x+r+1, y, x, y-r-1, x, y+r+1, c)
	}
	return fmt.Sprintf(`<circle cx="%.1f" cy="%.1f" r="%.1f" fill="%s"/>`, x, y, r, c)
}

// minMax returns the smallest and largest positive values of v.
func minMax(v map[string][]float64) (lo, hi float64) {
	for _, s := range v {
		for _, x := range s {
			if x <= 0 {
				continue
			}
			if lo == 0 || x < lo {
				lo = x
			}
			hi = max(hi, x)
		}
	}
	return lo, hi
}

// The chart's y axis is log10: every gridline (1-2-5 steps) and every
// point sits where log10 puts it between the decades' gridlines, so a
// 2330 ms turn is 0.367 of the way from 1000 to 10000, not 0.148 as on a
// scale linear within each decade. The turns are numbered, every policy
// with data gets a line with its own dash pattern, and the caption says
// what ran.
func TestChartLogScale(t *testing.T) {
	d := chartData{
		perTurn: map[string][]float64{
			"roundrobin": {14200, 2330, 3690, 2500, 3100},
			"affinity":   {14200, 950, 1510, 1500, 1520},
			"adaptive":   {14200, 950, 1510, 1500, 1520}, // on top of affinity
			"cost":       {14000, 940, 1490, 1480, 1500}, // a policy the seed had not
		},
		burst:    map[string]float64{"roundrobin": 18.7, "affinity": 31.3, "adaptive": 18.7, "cost": 18.9},
		replicas: 2, scale: 40,
	}
	svg := drawChart(d)
	grid := map[float64]float64{} // value -> y
	lines := map[string][]float64{}
	dashes := map[string]string{}
	var xticks []string
	var caption string
	dec := xml.NewDecoder(strings.NewReader(svg))
	var inText string
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the chart is not XML: %v\n%s", err, svg)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			attr := map[string]string{}
			for _, a := range e.Attr {
				attr[a.Name.Local] = a.Value
			}
			inText = ""
			switch {
			case e.Name.Local == "line" && attr["class"] == "ygrid":
				v, _ := strconv.ParseFloat(attr["data-v"], 64)
				y, _ := strconv.ParseFloat(attr["y1"], 64)
				grid[v] = y
			case e.Name.Local == "polyline" && attr["class"] == "turns":
				p := attr["data-policy"]
				dashes[p] = attr["stroke-dasharray"]
				for _, pt := range strings.Fields(attr["points"]) {
					_, ys, _ := strings.Cut(pt, ",")
					y, _ := strconv.ParseFloat(ys, 64)
					lines[p] = append(lines[p], y)
				}
			case e.Name.Local == "text":
				inText = attr["class"]
			}
		case xml.CharData:
			switch inText {
			case "xtick":
				xticks = append(xticks, string(e))
			case "caption":
				caption += string(e)
			}
		case xml.EndElement:
			inText = ""
		}
	}
	for _, v := range []float64{1000, 2000, 5000, 10000, 20000} {
		if _, ok := grid[v]; !ok {
			t.Fatalf("no gridline at %g: %v", v, grid)
		}
	}
	y1, y10 := grid[1000], grid[10000]
	decade := y10 - y1 // negative: up is smaller y
	want := func(v float64) float64 { return y1 + (math.Log10(v)-3)*decade }
	for v, y := range grid {
		if math.Abs(y-want(v)) > 0.1 {
			t.Errorf("gridline %g at y=%.1f, log10 puts it at %.1f", v, y, want(v))
		}
	}
	if len(lines) != len(d.perTurn) {
		t.Fatalf("lines for %v, want one for each of %v", lines, d.perTurn)
	}
	for p, ys := range lines {
		for i, y := range ys {
			if v := d.perTurn[p][i]; math.Abs(y-want(v)) > 0.1 {
				t.Errorf("%s turn %d (%g ms) at y=%.1f, log10 puts it at %.1f (%.3f of the decade, not %.3f)",
					p, i+1, v, y, want(v), (y-y1)/decade, math.Log10(v)-3)
			}
		}
	}
	// The seed's 2.45x gap reads as 2.45x: 0.389 of a decade.
	if gap := (lines["adaptive"][1] - lines["roundrobin"][1]) / -decade; math.Abs(gap-math.Log10(2330.0/950)) > 0.001 {
		t.Errorf("2330 ms over 950 ms spans %.3f of a decade, want %.3f", gap, math.Log10(2330.0/950))
	}
	if strings.Join(xticks, " ") != "1 2 3 4 5" {
		t.Errorf("turn labels %q, want 1 2 3 4 5", xticks)
	}
	seen := map[string]string{}
	for p, dash := range dashes {
		if q, dup := seen[dash]; dup {
			t.Errorf("%s and %s share the dash pattern %q", p, q, dash)
		}
		seen[dash] = p
	}
	for _, s := range []string{"2 simulated vLLM replicas", "40 times faster than real time"} {
		if !strings.Contains(caption, s) {
			t.Errorf("caption %q does not say %q", caption, s)
		}
	}
	if !strings.Contains(svg, ">cost</text>") {
		t.Error("the fourth policy has no legend or bar label")
	}
	// No data at all still draws.
	if _, err := xml.NewDecoder(strings.NewReader(drawChart(chartData{}))).Token(); err != nil {
		t.Error(err)
	}
}
