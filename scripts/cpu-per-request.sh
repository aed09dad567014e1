#!/usr/bin/env bash
# CPU time per request of proxy builds, measured side by side: the A/B of
# a change, where peers.sh's requests per second move too much between
# rounds on a shared machine.
#
#   ROUNDS=7 scripts/cpu-per-request.sh NAME=BINARY [NAME=BINARY ...]
#
# Each BINARY is a warmroute build, or a bareproxy build (a file named
# bareproxy*, given only -listen and -upstream), run pinned to CPU 0 with
# GOMAXPROCS=1 in front of two fake upstreams (CPU 1); wrk -t1 -c32 on
# CPU 1 sends peers.sh's 2 KB chat body for 1 s of warm-up and 4 s
# measured, and the proxy's utime+stime over those 4 s, divided by the
# requests, is printed for each round; the builds take turns in every
# round. Then the median of each. FU_ARGS passes flags to the fake
# upstreams (-answer-bytes 20000 for large answers); STREAM=1 asks for SSE
# answers (the fake upstreams' 16 events) instead; CONNS=1 loads one
# connection instead of 32; BODY_BYTES=360000 sends peers.sh's 90k-token
# body (chat-90k-c1) instead of the 2 KB one. Needs wrk and taskset. NAME=nginx (the binary
# named nginx, say nginx=/usr/sbin/nginx) runs nginx with one worker and
# peers.sh's settings, and counts its worker's CPU. The figures are written
# to benchmarks/results/cpu-per-request.md as well.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: scripts/cpu-per-request.sh NAME=BINARY ..." >&2; exit 2; }
for tool in wrk taskset go; do
  command -v $tool >/dev/null || { echo "cpu-per-request.sh needs $tool: apt-get install wrk" >&2; exit 2; }
done
rounds=${ROUNDS:-7}
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
. scripts/record.sh
record cpu-per-request "ROUNDS STREAM CONNS BODY_BYTES FU_ARGS" "$@"
go build -o "$tmp/fakeupstream" ./benchmarks/cmd/fakeupstream
go build -o "$tmp/loadgen" ./benchmarks/cmd/loadgen
"$tmp/loadgen" -print-body -body "${BODY_BYTES:-1800}" -turns 1 ${STREAM:+-stream} >"$tmp/body.json"
u1=127.0.0.1:19501 u2=127.0.0.1:19502 front=127.0.0.1:19500
# shellcheck disable=SC2086
GOMAXPROCS=1 taskset -c 1 "$tmp/fakeupstream" -listen $u1 ${FU_ARGS:-} >/dev/null 2>&1 & pids+=($!)
# shellcheck disable=SC2086
GOMAXPROCS=1 taskset -c 1 "$tmp/fakeupstream" -listen $u2 ${FU_ARGS:-} >/dev/null 2>&1 & pids+=($!)
scripts/nginx-conf.sh "$tmp" $front $u1 $u2 >"$tmp/nginx.conf"
hz=$(getconf CLK_TCK)
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
declare -A us
for round in $(seq "$rounds"); do
  for spec in "$@"; do
    name=${spec%%=*} bin=${spec#*=}
    case $(basename "$bin") in
      bareproxy*) args=(-listen $front -upstream "$u1,$u2") ;; # the floor: go build ./benchmarks/cmd/bareproxy
      nginx) args=(-c "$tmp/nginx.conf" -p "$tmp" -e "$tmp/nginx-error.log") ;;
      *) args=(-listen $front -admin-listen "" -upstream "http://$u1,http://$u2" -log-level warn -drain-delay 0) ;;
    esac
    GOMAXPROCS=1 taskset -c 0 "$bin" "${args[@]}" >/dev/null 2>&1 & pid=$!
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/${front%:*}/${front#*:}") 2>/dev/null && break; sleep 0.05; done
    measured=$pid
    [ "$(basename "$bin")" = nginx ] && measured=$(pgrep -P $pid | head -1) # the worker
    BODY=$tmp/body.json taskset -c 1 wrk -t1 -c${CONNS:-32} -d1s -s scripts/post.lua "http://$front/v1/chat/completions" >/dev/null 2>&1
    t0=$(ticks $measured)
    out=$(BODY=$tmp/body.json taskset -c 1 wrk -t1 -c${CONNS:-32} -d4s -s scripts/post.lua "http://$front/v1/chat/completions" 2>&1)
    t1=$(ticks $measured)
    kill $pid; wait $pid 2>/dev/null || true
    n=$(echo "$out" | awk '/requests in/{print $1}')
    v=$(awk -v a="$t0" -v b="$t1" -v hz="$hz" -v n="$n" 'BEGIN{printf "%.2f", (b-a)*1e6/hz/n}')
    us[$name]="${us[$name]:-} $v"
    printf '%-12s round %d  cpu us/request %s\n' "$name" "$round" "$v"
  done
done
for spec in "$@"; do
  name=${spec%%=*}
  # shellcheck disable=SC2086
  printf '%-12s median %s\n' "$name" "$(printf '%s\n' ${us[$name]} | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}')"
done
record_end
