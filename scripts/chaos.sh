#!/usr/bin/env bash
# Chaos run: warmroute in front of two simulated replicas (separate
# processes), under load, while replica 2 is restarted twice: once
# gracefully (SIGTERM, as a deploy does) and once killed (SIGKILL, as a
# crash). Prints what clients saw and what warmroute logged.
#   scripts/chaos.sh [seconds-per-phase]   (default 6)
set -euo pipefail
cd "$(dirname "$0")/.."
phase=${1:-6}
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

go build -o "$tmp/warmroute" .
go build -o "$tmp/warmroute-sim" ./benchmarks/cmd/warmroute-sim
go build -o "$tmp/loadgen" ./benchmarks/cmd/loadgen

p1=18101 p2=18102 front=18170 admin=18171
start_sim() { "$tmp/warmroute-sim" -listen "127.0.0.1:$1" -scale 20 >/dev/null 2>>"$tmp/sim$1.log" & echo $!; }
s1=$(start_sim $p1); s2=$(start_sim $p2); pids+=("$s1" "$s2")
"$tmp/warmroute" -listen "127.0.0.1:$front" -admin-listen "127.0.0.1:$admin" \
  -upstream "http://127.0.0.1:$p1,http://127.0.0.1:$p2" -health-interval 1s 2>"$tmp/warmroute.log" &
pids+=($!)
for _ in $(seq 50); do curl -fs "http://127.0.0.1:$front/health" >/dev/null && break; sleep 0.1; done

run() { # name, then what to do to replica 2 halfway through
  local name=$1 action=$2
  "$tmp/loadgen" -url "http://127.0.0.1:$front/v1/chat/completions" -c 8 -d "${phase}s" -stream -max-tokens 16 >"$tmp/load.txt" 2>&1 &
  local load=$!
  sleep "$(awk -v p="$phase" 'BEGIN{print p/3}')"
  case $action in
    term) kill -TERM "$s2"; while kill -0 "$s2" 2>/dev/null; do sleep 0.05; done ;;
    kill) kill -KILL "$s2"; while kill -0 "$s2" 2>/dev/null; do sleep 0.05; done ;;
  esac
  sleep 0.5
  s2=$(start_sim $p2); pids+=("$s2")
  wait "$load" || true
  local failovers; failovers=$(grep -c 'msg=failover' "$tmp/warmroute.log" || true)
  echo "== $name: replica 2 $action under load, restarted 0.5 s later"
  echo "   clients: $(head -1 "$tmp/load.txt")"
  sed -n '2,$p' "$tmp/load.txt" | sed 's/^/   /'
  echo "   warmroute: failover lines so far=$failovers, demotions so far=$(grep -c 'msg="replica demoted"' "$tmp/warmroute.log" || true), readmissions so far=$(grep -c 'msg="replica readmitted"' "$tmp/warmroute.log" || true)"
}
run "deploy (graceful restart)" term
run "crash (killed mid-request)" kill
echo "== warmroute's WARN lines:"
grep 'level=WARN' "$tmp/warmroute.log" | sed 's/^/   /' | head -20
