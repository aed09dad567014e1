#!/usr/bin/env bash
# Chaos run: warmroute in front of two simulated replicas (separate
# processes), under load, while replica 2 is restarted twice: once
# gracefully (SIGTERM, as a deploy does) and once killed (SIGKILL, as a
# crash); then hung (SIGSTOP: it accepts connections and answers nothing)
# and resumed (SIGCONT). Prints what clients saw and what warmroute logged.
#   scripts/chaos.sh [seconds-per-phase]   (default 6)
# The hung phase runs its own warmroute with the default -health-interval,
# -health-timeout and -stall-timeout (5 s, 2 s and 3 s), and lasts HUNG_BASE seconds
# of baseline (default 5), HUNG_STOP seconds stopped (default 15), then until
# replica 2 is readmitted (at most HUNG_READMIT seconds, default 60) and 3 s
# more. What it prints is written to benchmarks/results/chaos.md as well.
set -euo pipefail
cd "$(dirname "$0")/.."
phase=${1:-6}
hung_base=${HUNG_BASE:-5} hung_stop=${HUNG_STOP:-15} hung_readmit=${HUNG_READMIT:-60}
tmp=$(mktemp -d)
pids=() # every process started and not yet seen gone
forget() { local p keep=(); for p in "${pids[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done; pids=("${keep[@]}"); }
alive() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null) && [[ $st != Z* ]]; }
cleanup() {
  # A stopped process keeps a TERM pending until it runs again: CONT first.
  kill -CONT "${pids[@]}" 2>/dev/null || true
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true # the direct children (warmroute, loadgen)
  # The replicas were started from subshells, so wait does not see them.
  local p left=0
  for _ in $(seq 50); do
    left=0; for p in "${pids[@]}"; do alive "$p" && left=1; done
    [ "$left" = 0 ] && break; sleep 0.1
  done
  [ "$left" = 0 ] || kill -KILL "${pids[@]}" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
. scripts/record.sh
record chaos "HUNG_BASE HUNG_STOP HUNG_READMIT" "$@"

go build -o "$tmp/warmroute" .
go build -o "$tmp/warmroute-sim" ./benchmarks/cmd/warmroute-sim
go build -o "$tmp/loadgen" ./benchmarks/cmd/loadgen

p1=18101 p2=18102 front=18170 admin=18171
start_sim() { "$tmp/warmroute-sim" -listen "127.0.0.1:$1" -scale 20 >/dev/null 2>>"$tmp/sim$1.log" & echo $!; }
s1=$(start_sim $p1); s2=$(start_sim $p2); pids+=("$s1" "$s2")
"$tmp/warmroute" -listen "127.0.0.1:$front" -admin-listen "127.0.0.1:$admin" \
  -upstream "http://127.0.0.1:$p1,http://127.0.0.1:$p2" -health-interval 1s 2>"$tmp/warmroute.log" &
wr=$!; pids+=("$wr")
for _ in $(seq 50); do curl -fs "http://127.0.0.1:$front/health" >/dev/null && break; sleep 0.1; done

run() { # name, then what to do to replica 2 halfway through
  local name=$1 action=$2
  "$tmp/loadgen" -url "http://127.0.0.1:$front/v1/chat/completions" -c 8 -d "${phase}s" -stream -max-tokens 16 >"$tmp/load.txt" 2>&1 &
  local load=$!; pids+=("$load")
  sleep "$(awk -v p="$phase" 'BEGIN{print p/3}')"
  case $action in
    term) kill -TERM "$s2"; while alive "$s2"; do sleep 0.05; done ;;
    kill) kill -KILL "$s2"; while alive "$s2"; do sleep 0.05; done ;;
  esac
  forget "$s2"
  sleep 0.5
  s2=$(start_sim $p2); pids+=("$s2")
  wait "$load" || true; forget "$load"
  local failovers; failovers=$(grep -c 'msg=failover' "$tmp/warmroute.log" || true)
  echo "== $name: replica 2 $action under load, restarted 0.5 s later"
  echo "   clients: $(head -1 "$tmp/load.txt")"
  sed -n '2,$p' "$tmp/load.txt" | sed 's/^/   /'
  echo "   warmroute: failover lines so far=$failovers, demotions so far=$(grep -c 'msg="replica demoted"' "$tmp/warmroute.log" || true), readmissions so far=$(grep -c 'msg="replica readmitted"' "$tmp/warmroute.log" || true)"
}
run "deploy (graceful restart)" term
run "crash (killed mid-request)" kill

# The hung phase. Times are Unix microseconds.
stamp() { local _now=$EPOCHREALTIME; printf -v "$1" '%s' "${_now/[.,]/}"; }
secs() { awk -v u="$1" 'BEGIN{printf "%.2f s", u/1e6}'; }
sleep_until() { local now; stamp now; sleep "$(awk -v u=$(($1 - now)) 'BEGIN{if (u < 0) u = 0; printf "%.3f", u/1e6}')"; }
front2=18172 admin2=18173 hlog=$tmp/warmroute-hung.log reqs=$tmp/hung-requests.tsv
state2() { # replica 2's state in the admin listener's /replicas: live, down or nothing
  { curl -fs --max-time 1 "http://127.0.0.1:$admin2/replicas" || true; } |
    awk -v u="127.0.0.1:$p2" '/"url"/ {f = index($0, u) > 0} f && /"state"/ {gsub(/[",]/, "", $2); print $2; exit}'
}
wait_state() { # state, deadline; polls every 100 ms and sets at to when the state was seen
  local want=$1 until=$2 now got
  while :; do
    got=$(state2); stamp now
    [ "$got" = "$want" ] && { at=$now; return 0; }
    [ "$now" -ge "$until" ] && return 1
    sleep 0.1
  done
}
log_after() { # line count, msg: Unix µs of the first line past that count with msg, or nothing
  local ts
  ts=$(tail -n "+$(($1 + 1))" "$hlog" | grep -m1 -F "$2" | sed -n 's/^time=\([^ ]*\) .*/\1/p' || true)
  if [ -n "$ts" ]; then date -d "$ts" +%s%6N; fi
}
kill -TERM "$wr"; wait "$wr" || true; forget "$wr" # the 1 s health interval of the phases above is not the default
"$tmp/warmroute" -listen "127.0.0.1:$front2" -admin-listen "127.0.0.1:$admin2" \
  -upstream "http://127.0.0.1:$p1,http://127.0.0.1:$p2" 2>"$hlog" &
pids+=("$!")
stamp t; wait_state live $((t + 10000000)) || { echo "hung phase: replica 2 not live in warmroute after 10 s" >&2; exit 1; }
"$tmp/loadgen" -url "http://127.0.0.1:$front2/v1/chat/completions" -c 8 -d "$((hung_base + hung_stop + hung_readmit + 10))s" \
  -timeout 30s -stream -max-tokens 16 -log "$reqs" >"$tmp/load.txt" 2>&1 &
load=$!; pids+=("$load")
stamp t_load
sleep "$hung_base"
lines_stop=$(wc -l <"$hlog")
stamp t_stop; kill -STOP "$s2"
t_down=""; wait_state down $((t_stop + hung_stop * 1000000)) && t_down=$at
log_down=$(log_after "$lines_stop" 'msg="replica demoted as hung')
sleep_until $((t_stop + hung_stop * 1000000))
lines_cont=$(wc -l <"$hlog")
stamp t_cont; kill -CONT "$s2"
t_live=""; [ -n "$t_down" ] && wait_state live $((t_cont + hung_readmit * 1000000)) && t_live=$at
log_live=$(log_after "$lines_cont" 'msg="replica readmitted"')
sleep 3
stamp t_end; kill -TERM "$load"; wait "$load" || true; forget "$load"

echo "== hung (kill -STOP): replica 2 stopped under load for ${hung_stop} s, then resumed (warmroute with default health flags)"
echo "   clients, whole phase: $(head -1 "$tmp/load.txt")"
sed -n '2,$p' "$tmp/load.txt" | sed 's/^/   /'
if [ -n "$t_down" ]; then
  echo -n "   STOP to demotion: $(secs $((t_down - t_stop))) (polled /replicas)"
  if [ -n "$log_down" ]; then echo ", $(secs $((log_down - t_stop))) (time of the log line)"; else echo ", no 'demoted as hung' line in the log"; fi
else
  echo "   STOP to demotion: not demoted within ${hung_stop} s"
fi
[ -s "$reqs" ] || { echo "   loadgen logged no request" >&2; exit 1; }
# One line per request: start, end, latency, outcome. Throughput counts the
# answers that ended well inside a window; the first second of load is warm-up.
awk -F'\t' -v t0=$((t_load + 1000000)) -v stop="$t_stop" -v down="${t_down:-$t_cont}" -v cont="$t_cont" \
    -v live="${t_live:-$t_end}" -v end="$t_end" -v demoted="${t_down:+1}" '
  function rps(a, b, n) { return (b > a) ? n / ((b - a) / 1e6) : 0 }
  $4 == "ok" && $2 >= t0 && $2 < stop { base++ }
  $4 == "ok" && $2 >= stop && $2 < cont { during++ }
  $4 == "ok" && $2 >= stop && $2 < down { stuck++ }
  $4 == "ok" && $2 >= down && $2 < cont { after++ }
  $4 == "ok" && $2 >= live && $2 < end { back++ }
  $1 < cont && $2 > stop && $2 - $1 > longest { longest = $2 - $1; what = ($4 == "ok") ? sprintf("ok, first byte after %.3f s", $3 / 1e6) : $4 }
  $4 != "ok" && $1 < cont && $2 > stop { k = $4; gsub(/127\.0\.0\.1:[0-9]+/, "127.0.0.1:*", k); errs[k]++; nerr++ }
  END {
    b = rps(t0, stop, base)
    printf "   throughput: baseline %.0f req/s; during the stop %.0f req/s = %.0f%% of baseline", b, rps(stop, cont, during), b ? 100 * rps(stop, cont, during) / b : 0
    if (demoted) printf " (%.0f%% until the demotion, %.0f%% after it)", b ? 100 * rps(stop, down, stuck) / b : 0, b ? 100 * rps(down, cont, after) / b : 0
    printf "\n   longest request in flight during the stop: %.1f s (%s)\n", longest / 1e6, what
    printf "   errors the clients saw during the stop: %d\n", nerr
    for (k in errs) printf "     error x%d: %s\n", errs[k], k
    if (live < end) printf "   after readmission: %.0f req/s = %.0f%% of baseline\n", rps(live, end, back), b ? 100 * rps(live, end, back) / b : 0
  }' "$reqs"
if [ -n "$t_live" ]; then
  echo -n "   CONT to readmission: $(secs $((t_live - t_cont))) (polled /replicas)"
  if [ -n "$log_live" ]; then echo ", $(secs $((log_live - t_cont))) (time of the log line)"; else echo ", no 'readmitted' line in the log"; fi
elif [ -n "$t_down" ]; then
  echo "   CONT to readmission: not readmitted within ${hung_readmit} s"
fi

echo "== warmroute's WARN lines (deploy and crash):"
grep 'level=WARN' "$tmp/warmroute.log" | sed 's/^/   /' | head -20
echo "== warmroute's demotions, readmissions and WARN lines (hung):"
grep -E 'level=WARN|msg="replica (demoted|readmitted)' "$hlog" | sed 's/^/   /' | head -20
record_end
