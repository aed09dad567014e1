package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// flagGroups orders -help by concern. Every flag is in one group
// (TestFlagGroups); its text is its usage string, in main.go.
var flagGroups = []struct{ title, names string }{
	{"Front door", "listen tls-cert-file tls-key-file api-key-file strip-authorization forward-path client-read-timeout client-write-timeout client-idle-timeout drain-delay drain-timeout"},
	{"Replicas and discovery", "upstream upstream-dns upstream-srv upstream-file dns-interval simulate simulate-scale upstream-ca-file upstream-server-name upstream-insecure-skip-verify connect-timeout upstream-keepalive-timeout max-idle-conns scrape-interval replica-metrics-path"},
	{"Routing", "routing placement session-header prompt-chunk held-memory kv-capacity pin-capacity pin-store pin-store-timeout pin-ttl"},
	{"Health and failover", "max-sends first-byte-timeout stream-idle-timeout stream-min-rate response-timeout stall-timeout health-path health-interval health-timeout cooldown max-cooldown"},
	{"Limits", "max-body-size max-body-memory buffer-limit"},
	{"Admin and observability", "admin-listen admin-tls-cert-file admin-tls-key-file pprof access-log otlp-endpoint log-format log-level version"},
}

// usage prints -help: the flags by group, each group's in name order.
func usage() {
	w := flag.CommandLine.Output()
	fmt.Fprintf(w, "Usage: warmroute -upstream URL[,URL...] [flags]\n       warmroute -simulate N [flags]\n\nEvery flag can also be set as WARMROUTE_<NAME> (e.g. WARMROUTE_MAX_SENDS=3); ROUTING sets -routing.\nA flag on the command line wins over the environment.\n")
	for _, g := range flagGroups {
		fmt.Fprintf(w, "\n%s:\n", g.title)
		fs := flag.NewFlagSet(g.title, flag.ContinueOnError)
		fs.SetOutput(w)
		for _, name := range strings.Fields(g.names) {
			f := flag.Lookup(name)
			fs.Var(f.Value, f.Name, f.Usage)
			fs.Lookup(name).DefValue = f.DefValue
		}
		fs.PrintDefaults()
	}
}

// envAliases are environment names read besides WARMROUTE_<FLAG> (upper
// case, dashes as underscores), which every flag is read from.
var envAliases = map[string]string{"routing": "ROUTING"}

// renamedFlags are old names of flags, with their new ones: an old name
// still sets its flag, and the first use of it is logged (logRenamed). They
// are left out of -help.
var renamedFlags = map[string]string{
	"max-body-bytes":        "max-body-memory",
	"idle-timeout":          "client-idle-timeout",
	"upstream-idle-timeout": "upstream-keepalive-timeout",
}

// renamedUsed are the old names set, in the order they were.
var renamedUsed []string

func init() {
	for old, name := range renamedFlags {
		flag.Var(renamed{flag.Lookup(name).Value, old}, old, "Renamed -"+name+".")
	}
	for name, why := range removedFlags {
		flag.Var(removed(why), name, "Removed: "+why+".")
	}
}

// renamed is a flag's old name: it sets the flag under its new name.
type renamed struct {
	flag.Value
	old string
}

func (r renamed) Set(v string) error {
	if !slices.Contains(renamedUsed, r.old) {
		renamedUsed = append(renamedUsed, r.old)
	}
	return r.Value.Set(v)
}

// logRenamed logs each old flag name that was used, once.
func logRenamed(log *slog.Logger) {
	for _, old := range renamedUsed {
		log.Warn("flag renamed; the old name still works", "flag", "-"+old, "now", "-"+renamedFlags[old])
	}
}

// removedFlags are flags that earlier versions took, with what to do
// instead: a deploy that still passes one, or sets it as WARMROUTE_<NAME>,
// fails at once with the reason, not with "flag provided but not defined".
var removedFlags = map[string]string{
	"relay-above":         "streams are served by the HTTP server's own connection goroutines; drop the flag",
	"relay-waiting-above": "requests wait for their replica on the HTTP server's own connection goroutines; drop the flag",
}

// removed is a removed flag: setting it is an error.
type removed string

func (removed) String() string { return "" }

func (r removed) Set(string) error { return errors.New("this flag was removed: " + string(r)) }

// applyEnv sets each flag not given on the command line from its
// environment variable; a bad value fails like a bad flag.
func applyEnv() error {
	given := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	flag.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || err != nil {
			return
		}
		names := []string{"WARMROUTE_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))}
		if alias, ok := envAliases[f.Name]; ok {
			names = append(names, alias)
		}
		for _, n := range names {
			if v, ok := os.LookupEnv(n); ok {
				if e := f.Value.Set(v); e != nil {
					err = fmt.Errorf("invalid %s=%q: %v", n, v, e)
				}
				return
			}
		}
	})
	return err
}

func durationFlag(name string, def time.Duration, usage string) *time.Duration {
	d := &duration{d: def}
	flag.Var(d, name, usage)
	return &d.d
}

// durationFlagZero is durationFlag for a duration that may also be 0.
func durationFlagZero(name string, def time.Duration, usage string) *time.Duration {
	d := &duration{d: def, zeroOff: true}
	flag.Var(d, name, usage)
	return &d.d
}

func (d *duration) String() string { return d.d.String() }

func (d *duration) Set(v string) error {
	t, err := time.ParseDuration(strings.TrimSpace(v))
	switch {
	case d.zeroOff && (err != nil || t < 0):
		return fmt.Errorf("want 0 or a positive duration with a unit, like 5s, 250ms or 2m")
	case !d.zeroOff && (err != nil || t <= 0):
		return fmt.Errorf("want a positive duration with a unit, like 5s, 250ms or 2m")
	}
	d.d = t
	return nil
}

// list is a flag of request paths, repeated or comma-separated.
type list []string

func listFlag(name, usage string) *[]string {
	l := &list{}
	flag.Var(l, name, usage)
	return (*[]string)(l)
}

func (l *list) String() string { return strings.Join(*l, ",") }

func (l *list) Set(v string) error {
	for _, p := range splitList(v) {
		if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, "?# ") || strings.Contains(p, "/.") || strings.Contains(p, "%") {
			return fmt.Errorf("%q is not a plain path: want one like /reset_prefix_cache, with no query, dot segment or %%-escape", p)
		}
		*l = append(*l, p)
	}
	return nil
}

// size is a byte count flag that takes units: 64MiB, 512KiB, 1GB, 1024.
type size int64

func sizeFlag(name string, def int64, usage string) *size {
	s := size(def)
	flag.Var(&s, name, usage)
	return &s
}

func (s *size) String() string { return formatSize(int64(*s)) }

func (s *size) Set(v string) error {
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	*s = size(n)
	return nil
}

var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"b", 1},
}

func parseSize(v string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(v))
	mult := int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n <= 0 || n > (1<<40)/mult {
		return 0, fmt.Errorf("invalid size %q: want a positive number with an optional unit (B, KiB, MiB, GiB, KB, MB, GB), e.g. 64MiB", v)
	}
	return n * mult, nil
}

func formatSize(n int64) string {
	for _, u := range []struct {
		s string
		m int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.m && n%u.m == 0 {
			return strconv.FormatInt(n/u.m, 10) + u.s
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}
