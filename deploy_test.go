package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/router"
	"github.com/warmroute/warmroute/upstream"
)

// flagToken is a warmroute flag on a command line in a deploy file.
var flagToken = regexp.MustCompile(`(?:^|[\s"'\[])-([a-z][a-z0-9]*(?:-[a-z0-9]+)*)(?:$|[\s"',\]])`)

// deployFlags returns the flags that the deploy files pass to warmroute:
// the Dockerfile's ENTRYPOINT and its docker run example (after the image
// name), the Kubernetes args, and the systemd ExecStart and its comments.
func deployFlags(t *testing.T) map[string]string {
	t.Helper()
	found := map[string]string{}
	scan := func(file, text string) {
		for _, m := range flagToken.FindAllStringSubmatch(text, -1) {
			found[m[1]] = file
		}
	}
	// A Kubernetes container's args, one a line.
	yamlArgs := func(line string) string {
		if strings.HasPrefix(strings.TrimSpace(line), "- -") {
			return strings.TrimPrefix(strings.TrimSpace(line), "-")
		}
		return ""
	}
	for file, pick := range map[string]func(line string) string{
		"deploy/Dockerfile": func(line string) string {
			if strings.HasPrefix(line, "ENTRYPOINT") {
				return line
			}
			if _, after, ok := strings.Cut(line, "docker run"); ok {
				if _, args, ok := strings.Cut(after, " warmroute "); ok {
					return " " + args
				}
			}
			return ""
		},
		"deploy/kubernetes/warmroute.yaml":       yamlArgs,
		"deploy/kubernetes/warmroute-fleet.yaml": yamlArgs,
		"deploy/systemd/warmroute.service": func(line string) string {
			if _, after, ok := strings.Cut(line, "/warmroute "); ok && strings.HasPrefix(line, "ExecStart=") {
				return " " + after
			}
			if strings.HasPrefix(line, "#") && strings.Contains(line, "Add -") {
				return line
			}
			return ""
		},
	} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			scan(file, pick(line))
		}
	}
	return found
}

// Every flag that the deploy files use exists in warmroute -help, and every
// metric that the Grafana dashboard queries is exposed.
func TestDeployFiles(t *testing.T) {
	flags := deployFlags(t)
	if len(flags) < 6 {
		t.Fatalf("found only %d flags in the deploy files: the scan is broken", len(flags))
	}
	for name, file := range flags {
		if flag.Lookup(name) == nil {
			t.Errorf("%s passes -%s, which warmroute does not have", file, name)
		}
	}

	set, err := upstream.NewSet([]string{"127.0.0.1:1"}, upstream.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pins := prefixcache.NewPinMap(16, 1)
	m := router.NewMetrics(set, pins)
	router.New(router.Config{}, set, pins, m).Server(router.ServerConfig{MaxBodySize: 1 << 20, BodyBudget: 1 << 30})
	var out bytes.Buffer
	m.WritePrometheus(&out)
	exposed := map[string]bool{}
	for _, line := range strings.Split(out.String(), "\n") {
		if name, _, _ := strings.Cut(line, " "); name != "" && !strings.HasPrefix(line, "#") {
			name, _, _ = strings.Cut(name, "{")
			exposed[name] = true
		}
	}
	b, err := os.ReadFile("deploy/grafana/warmroute.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	queried := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, name := range regexp.MustCompile(`warmroute_[a-z_]+`).FindAllString(tg.Expr, -1) {
				queried++
				if !exposed[name] {
					t.Errorf("panel %q queries %s, which /metrics does not expose", p.Title, name)
				}
			}
		}
	}
	if queried < 10 {
		t.Fatalf("the dashboard queries only %d series: the scan is broken", queried)
	}
}

// Every file that a Kubernetes manifest passes to a -*-file flag lies in a
// volume that the container mounts: a certificate that is not there fails
// the start.
func TestDeployFilesAreMounted(t *testing.T) {
	for _, file := range []string{"deploy/kubernetes/warmroute.yaml", "deploy/kubernetes/warmroute-fleet.yaml"} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var mounts []string
		files := map[string]string{} // flag: path
		lines := strings.Split(string(b), "\n")
		for i, line := range lines {
			line = strings.TrimSpace(line)
			if path, ok := strings.CutPrefix(line, "mountPath: "); ok {
				mounts = append(mounts, strings.TrimSuffix(path, "/")+"/")
			}
			if name, ok := strings.CutPrefix(line, "- -"); ok && strings.HasSuffix(name, "-file") && i+1 < len(lines) {
				files[name] = strings.TrimPrefix(strings.TrimSpace(lines[i+1]), "- ")
			}
		}
		if len(files) == 0 {
			t.Errorf("%s passes no file: the scan is broken, or the manifest lost its TLS", file)
		}
		for name, path := range files {
			mounted := false
			for _, m := range mounts {
				mounted = mounted || strings.HasPrefix(path, m)
			}
			if !mounted {
				t.Errorf("%s passes -%s %s, which no volume mounts (mounts: %v)", file, name, path, mounts)
			}
		}
	}
}
