#!/usr/bin/env bash
# Holds N slow SSE streams open through a proxy at once (the fake upstream
# sends an event a second, 10 events), and reports the proxy's resident
# memory per open stream; for warmroute also its heap and goroutines per
# stream, and whether they return to baseline once the streams end, and
# what the open streams hold after two GCs: the pooled buffers that their
# opening left are then gone, though resident memory lags until the
# runtime returns the pages.
#   scripts/streams.sh [N] [proxies...]   (default 9000 warmroute nginx; also
#                        base, bareproxy, gorelay; a proxy holds 2 sockets a
#                        stream, and this machine caps open files at 20000)
# nginx (apt-get install nginx) runs with one worker and proxy_buffering
# off in front of the same fake upstreams, as in scripts/peers.sh; its
# figure is its worker's resident memory. bareproxy (the least fasthttp
# proxy) and gorelay (the least Go relay, a goroutine per connection), the
# floors of scripts/peers.sh, are measured by resident memory as nginx is.
# Proxies run one after the other.
# WARMROUTE_BIN=path measures a prebuilt warmroute; WARMROUTE_BASE=path adds
# the proxy "base", another warmroute binary measured the same way, for a
# before/after in one run. PROFILE_DIR=dir keeps, for warmroute and base,
# the heap profile (inuse_space) and the goroutine profile taken while all
# streams are open: dir/<proxy>.heap, dir/<proxy>.goroutine. HEAD_FIRST=1
# has the fake upstreams send each answer's head at once, as vLLM's server
# does, rather than with the first event a second later. RATE=r opens the
# streams at r a second rather than all at once (a burst: the requests that
# wait for their first byte hold fasthttp's buffers, and what a Go process
# takes at a peak goes back to the system only slowly).
# It prints its figures and writes them to benchmarks/results/streams.md.
set -euo pipefail
cd "$(dirname "$0")/.."
args=("$@")
n=${1:-9000}; shift || true
proxies=${*:-warmroute nginx}
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; [ -f "$tmp/nginx.pid" ] && kill "$(cat "$tmp/nginx.pid")" 2>/dev/null; sleep 0.2; rm -rf "$tmp"; }
trap cleanup EXIT
. scripts/record.sh
record streams "HEAD_FIRST RATE PROFILE_DIR WARMROUTE_BIN WARMROUTE_BASE" "${args[@]}"
if [ -n "${WARMROUTE_BIN:-}" ]; then cp "$WARMROUTE_BIN" "$tmp/warmroute"; else go build -o "$tmp/warmroute" .; fi
if [ -n "${WARMROUTE_BASE:-}" ]; then cp "$WARMROUTE_BASE" "$tmp/base"; fi
go build -o "$tmp/fakeupstream" ./benchmarks/cmd/fakeupstream
go build -o "$tmp/streams" ./benchmarks/cmd/streams
case " $proxies " in *" bareproxy "*) go build -o "$tmp/bareproxy" ./benchmarks/cmd/bareproxy ;; esac
case " $proxies " in *" gorelay "*) go build -o "$tmp/gorelay" ./benchmarks/cmd/gorelay ;; esac
"$tmp/fakeupstream" -listen 127.0.0.1:19201 -chunks 10 -chunk-interval 1s ${HEAD_FIRST:+-head-first} & pids+=($!)
"$tmp/fakeupstream" -listen 127.0.0.1:19202 -chunks 10 -chunk-interval 1s ${HEAD_FIRST:+-head-first} & pids+=($!)
scripts/nginx-conf.sh "$tmp" 127.0.0.1:19280 127.0.0.1:19201 127.0.0.1:19202 >"$tmp/nginx.conf"
rss() { awk '/VmRSS/{print $2}' /proc/$1/status; }          # KiB
wait_open() { # client-output-file client-pid
  until grep -q '^open' "$1" 2>/dev/null; do
    kill -0 "$2" 2>/dev/null || { cat "$1"; exit 1; }
    sleep 0.1
  done
}
# measure_rss NAME PID: warms up, opens the n streams, and prints the
# process's resident memory per open stream (for the proxies whose heap
# cannot be read).
measure_rss() {
  "$tmp/streams" -addr 127.0.0.1:19280 -n 2 >/dev/null
  sleep 1
  local rss0 rss1 rss2 client
  rss0=$(rss "$2")
  "$tmp/streams" -addr 127.0.0.1:19280 -n "$n" ${RATE:+-rate "$RATE"} >"$tmp/out" 2>&1 & client=$!
  wait_open "$tmp/out" $client
  sleep 1
  rss1=$(rss "$2")
  wait $client || true
  sleep 2
  rss2=$(rss "$2")
  echo "$1 streams: $(tr '\n' ' ' <"$tmp/out")"
  echo "$1 baseline: rss=${rss0} KiB; all open: rss=${rss1} KiB; after: rss=${rss2} KiB"
  awk -v p="$1" -v a="$rss0" -v b="$rss1" -v n="$n" 'BEGIN{printf "%s per open stream: %.1f KiB resident\n", p, (b-a)/n}'
}
for proxy in $proxies; do
  case $proxy in
  warmroute|base)
    [ -x "$tmp/$proxy" ] || { echo "proxy base needs WARMROUTE_BASE=path" >&2; exit 2; }
    "$tmp/$proxy" -listen 127.0.0.1:19280 -admin-listen 127.0.0.1:19281 -pprof -log-level warn -drain-delay 0 \
      -upstream http://127.0.0.1:19201,http://127.0.0.1:19202 2>"$tmp/$proxy.log" & wr=$!; pids+=($wr)
    for _ in $(seq 50); do curl -fs http://127.0.0.1:19280/health >/dev/null && break; sleep 0.1; done
    # awk reads the whole answer: head would close the pipe on curl (exit 23 under pipefail).
    gor() { curl -fs 'http://127.0.0.1:19281/debug/pprof/goroutine?debug=1' | awk 'NR==1{sub(/.*total /, ""); print}'; }
    fds() { ls /proc/$wr/fd | wc -l; }
    heap() { curl -fs http://127.0.0.1:19281/metrics | awk '/^go_memstats_heap_inuse_bytes/{printf "%.0f", $2/1024}'; }
    stack() { curl -fs http://127.0.0.1:19281/metrics | awk '/^go_memstats_stack_inuse_bytes/{printf "%.0f", $2/1024}'; }
    # Warm up once so that the baseline includes the pools a first request makes.
    "$tmp/streams" -addr 127.0.0.1:19280 -n 2 >/dev/null
    sleep 1
    rss0=$(rss $wr); g0=$(gor); f0=$(fds); h0=$(heap); s0=$(stack)
    "$tmp/streams" -addr 127.0.0.1:19280 -n "$n" ${RATE:+-rate "$RATE"} >"$tmp/out" 2>&1 & client=$!
    wait_open "$tmp/out" $client
    sleep 1
    rss1=$(rss $wr); g1=$(gor); f1=$(fds); h1=$(heap); s1=$(stack)
    # What the open streams hold, rather than what their opening left in
    # the pools: two GCs (the second empties sync.Pool's victim cache)
    # with the streams still open (they run 10 s), 3 s after they opened.
    sleep 3
    curl -fs -o /dev/null 'http://127.0.0.1:19281/debug/pprof/heap?gc=1'
    curl -fs -o /dev/null 'http://127.0.0.1:19281/debug/pprof/heap?gc=1'
    hh=$(heap); sh=$(stack); gh=$(gor); rh=$(rss $wr)
    if [ -n "${PROFILE_DIR:-}" ]; then
      mkdir -p "$PROFILE_DIR"
      curl -fs -o "$PROFILE_DIR/$proxy.heap" 'http://127.0.0.1:19281/debug/pprof/heap?gc=1'
      curl -fs -o "$PROFILE_DIR/$proxy.goroutine" 'http://127.0.0.1:19281/debug/pprof/goroutine'
    fi
    wait $client || true
    # fasthttp's idle worker goroutines go within 10 s; a GC (pprof's
    # heap?gc=1) returns the pooled per-connection objects.
    sleep 12
    curl -fs -o /dev/null 'http://127.0.0.1:19281/debug/pprof/heap?gc=1'
    curl -fs -o /dev/null 'http://127.0.0.1:19281/debug/pprof/heap?gc=1'
    rss2=$(rss $wr); g2=$(gor); f2=$(fds); h2=$(heap)
    echo "$proxy streams: $(cat "$tmp/out" | tr '\n' ' ')"
    echo "$proxy baseline:     rss=${rss0} KiB heap_inuse=${h0} KiB goroutines=$g0 fds=$f0"
    echo "$proxy all open:     rss=${rss1} KiB heap_inuse=${h1} KiB goroutines=$g1 fds=$f1"
    echo "$proxy after (12 s): rss=${rss2} KiB heap_inuse=${h2} KiB goroutines=$g2 fds=$f2"
    awk -v p="$proxy" -v a="$rss0" -v b="$rss1" -v h0="$h0" -v h1="$h1" -v s0="$s0" -v s1="$s1" -v g0="$g0" -v g1="$g1" -v n="$n" 'BEGIN{printf "%s per open stream: %.1f KiB resident, %.1f KiB heap, %.1f KiB goroutine stacks, %.2f goroutines\n", p, (b-a)/n, (h1-h0)/n, (s1-s0)/n, (g1-g0)/n}'
    awk -v p="$proxy" -v a="$rss0" -v r="$rh" -v h0="$h0" -v h1="$hh" -v s0="$s0" -v s1="$sh" -v g0="$g0" -v g1="$gh" -v n="$n" 'BEGIN{printf "%s held per open stream after two GCs: %.1f KiB heap, %.1f KiB goroutine stacks, %.2f goroutines (%.1f KiB resident then)\n", p, (h1-h0)/n, (s1-s0)/n, (g1-g0)/n, (r-a)/n}'
    echo "$proxy back to baseline: goroutines $([ "$g2" -le $((g0 + 5)) ] && echo yes || echo NO)," \
      "fds $([ "$f2" -le $((f0 + 2*256 + 5)) ] && echo "yes (the idle pool keeps up to 256 connections per replica)" || echo NO)," \
      "heap in use $([ "$h2" -le $((h0 * 2 + 4096)) ] && echo yes || echo NO) (resident memory goes back to the OS as the Go runtime scavenges)"
    kill $wr; wait $wr 2>/dev/null || true
    ;;
  bareproxy|gorelay)
    "$tmp/$proxy" -listen 127.0.0.1:19280 -upstream 127.0.0.1:19201,127.0.0.1:19202 >/dev/null 2>"$tmp/$proxy.log" & pp=$!; pids+=($pp)
    for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/19280) 2>/dev/null && break; sleep 0.1; done
    measure_rss "$proxy" $pp
    kill $pp; wait $pp 2>/dev/null || true
    ;;
  nginx)
    command -v nginx >/dev/null || { echo "streams.sh nginx needs nginx: apt-get install nginx" >&2; exit 2; }
    nginx -c "$tmp/nginx.conf" -e "$tmp/nginx-error.log" -p "$tmp" >/dev/null 2>&1 & pids+=($!)
    for _ in $(seq 50); do [ -f "$tmp/nginx.pid" ] && pgrep -P "$(cat "$tmp/nginx.pid")" >/dev/null && break; sleep 0.1; done
    worker=$(pgrep -P "$(cat "$tmp/nginx.pid")" | head -1)
    measure_rss nginx "$worker"
    kill "$(cat "$tmp/nginx.pid")"; sleep 0.5; rm -f "$tmp/nginx.pid"
    ;;
  esac
done
record_end
