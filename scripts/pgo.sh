#!/usr/bin/env bash
# Regenerates default.pgo, the CPU profile that `go build` uses for
# profile-guided optimization of the warmroute binary (Go reads default.pgo
# beside the main package by itself).
#
#   scripts/pgo.sh [seconds-per-load]   (default 10)
#
# warmroute, built without a profile, runs in front of two fast fake
# upstreams while the load generator sends non-streamed chat over 32
# connections with conversations that grow over turns (pins and hashing),
# then 360 KB prompts over one connection. One CPU profile spans the two.
# SSE is left out on purpose: with streams in the profile, the inlining
# that it leads to made each open stream's goroutine stack 16 KiB rather
# than 8 (scripts/streams.sh: 39.5 against 32.2 KiB resident a stream),
# for no CPU that peers.sh could see. Rerun it after a change to the
# request path; a stale profile is still correct, only less useful.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

go build -pgo=off -o "$tmp/warmroute" .
go build -o "$tmp/fakeupstream" ./benchmarks/cmd/fakeupstream
go build -o "$tmp/loadgen" ./benchmarks/cmd/loadgen
u1=127.0.0.1:19411 u2=127.0.0.1:19412 front=127.0.0.1:19410 admin=127.0.0.1:19419
"$tmp/fakeupstream" -listen $u1 >/dev/null 2>&1 & pids+=($!)
"$tmp/fakeupstream" -listen $u2 >/dev/null 2>&1 & pids+=($!)
"$tmp/warmroute" -listen $front -admin-listen $admin -pprof -upstream "http://$u1,http://$u2" \
  -log-level warn -drain-delay 0 >/dev/null 2>&1 & pids+=($!)
for addr in $u1 $u2 $front $admin; do
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/${addr%:*}/${addr#*:}") 2>/dev/null && break; sleep 0.1; done
done

total=$((2 * secs + 2))
curl -fsS -o "$tmp/cpu.pprof" "http://$admin/debug/pprof/profile?seconds=$total" & prof=$!
url=http://$front/v1/chat/completions
"$tmp/loadgen" -url $url -c 32 -d "${secs}s" -body 2000 -turns 4 >/dev/null
"$tmp/loadgen" -url $url -c 1 -d "${secs}s" -body 360000 -turns 1 >/dev/null
wait $prof
cp "$tmp/cpu.pprof" default.pgo
go tool pprof -top -nodecount 8 default.pgo 2>/dev/null | sed -n '1,14p'
