#!/usr/bin/env bash
# User-space instructions per request of proxy builds, counted by valgrind's
# cachegrind: unlike CPU time (scripts/cpu-per-request.sh), a count that
# does not move with what else the machine runs, so an A/B of a change can
# be read from one run. It counts no kernel work (system calls, the
# network stack): what it compares is the proxy's own code and Go's.
#
#   scripts/instructions.sh NAME=BINARY [NAME=BINARY ...]
#
# Each BINARY is a warmroute build, or a bareproxy build (a file named
# bareproxy*, given only -listen and -upstream), run under cachegrind with
# GOMAXPROCS=1 in front of two fake upstreams; wrk -t1 -c32 sends peers.sh's
# 2 KB chat body (STREAM=1: the SSE body, the fake upstreams' 16 events)
# for SHORT and then LONG seconds (default 3 and 9), one run each, and
# (instructions of the long run - of the short) / (requests of the long
# - of the short) is printed: the start and the exit cancel out. EXTRA
# holds more flags for the warmroute builds (-routing cost, say). Slowed
# about fifty times, a build serves a few thousand requests a second.
# Needs valgrind and wrk. The figures are written to
# benchmarks/results/instructions.md as well.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: scripts/instructions.sh NAME=BINARY ..." >&2; exit 2; }
for tool in valgrind wrk go; do
  command -v $tool >/dev/null || { echo "instructions.sh needs $tool: apt-get install valgrind wrk" >&2; exit 2; }
done
short=${SHORT:-3} long=${LONG:-9}
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
. scripts/record.sh
record instructions "STREAM SHORT LONG EXTRA" "$@"
go build -o "$tmp/fakeupstream" ./benchmarks/cmd/fakeupstream
go build -o "$tmp/loadgen" ./benchmarks/cmd/loadgen
"$tmp/loadgen" -print-body -body 1800 -turns 1 ${STREAM:+-stream} >"$tmp/body.json"
u1=127.0.0.1:19511 u2=127.0.0.1:19512 front=127.0.0.1:19510
GOMAXPROCS=1 "$tmp/fakeupstream" -listen $u1 >/dev/null 2>&1 & pids+=($!)
GOMAXPROCS=1 "$tmp/fakeupstream" -listen $u2 >/dev/null 2>&1 & pids+=($!)
# run BINARY SECONDS: prints "instructions requests".
run() {
  local bin=$1 secs=$2 args pid n ir
  case $(basename "$bin") in
    bareproxy*) args=(-listen $front -upstream "$u1,$u2") ;;
    *) args=(-listen $front -admin-listen "" -upstream "http://$u1,http://$u2" -log-level warn -drain-delay 0 ${EXTRA:-}) ;;
  esac
  # No asynchronous preemption: its signals are not what is measured.
  GODEBUG=asyncpreemptoff=1 GOMAXPROCS=1 valgrind --tool=cachegrind --cache-sim=no \
    --cachegrind-out-file="$tmp/cg.out" "$bin" "${args[@]}" >/dev/null 2>"$tmp/vg.err" & pid=$!
  for _ in $(seq 300); do (exec 3<>"/dev/tcp/${front%:*}/${front#*:}") 2>/dev/null && break; sleep 0.1; done
  n=$(BODY=$tmp/body.json wrk -t1 -c32 -d"${secs}s" -s scripts/post.lua "http://$front/v1/chat/completions" 2>&1 | awk '/requests in/{print $1}')
  kill -TERM $pid; wait $pid 2>/dev/null || true
  ir=$(awk '/^summary:/{print $2}' "$tmp/cg.out")
  echo "$ir $n"
}
for spec in "$@"; do
  name=${spec%%=*} bin=${spec#*=}
  read -r i1 n1 < <(run "$bin" "$short")
  read -r i2 n2 < <(run "$bin" "$long")
  awk -v name="$name" -v i1="$i1" -v n1="$n1" -v i2="$i2" -v n2="$n2" \
    'BEGIN{printf "%-12s instructions/request %.0f  (%d and %d requests)\n", name, (i2-i1)/(n2-n1), n1, n2}'
done
record_end
