#!/usr/bin/env bash
# Measures warmroute beside nginx and HAProxy in front of the same two fast
# fake upstreams, one proxy at a time, with equivalent settings (keep-alive
# to upstreams, no response buffering, one worker), the proxy pinned to CPU 0
# and everything else to CPU 1. It installs nothing; it needs:
#   apt-get install nginx haproxy wrk      (and Go, taskset)
#   scripts/peers.sh [seconds-per-run] [proxies...]   (default 5; direct warmroute bare relay nginx haproxy)
# bare is the least fasthttp proxy (benchmarks/cmd/bareproxy: HostClient,
# round-robin, nothing else) and relay the least Go relay
# (benchmarks/cmd/gorelay: net.Conn and bufio, framing only): what fasthttp
# and the Go runtime cost before warmroute does anything.
# WARMROUTE_BIN=path measures a prebuilt warmroute; WARMROUTE_BASE=path adds
# the proxy "base", another warmroute binary, so that an A/B comparison runs
# side by side in one run: scripts/peers.sh 5 direct base warmroute nginx
# ROUNDS=N repeats the whole set N times, proxies interleaved, and prints the
# median of each cell as well: this machine is shared and one run is noisy.
# SHARED=1 pins nothing: the proxy, the load generator and the upstreams
# share both CPUs, as on a host that runs them together (the proxies keep
# one worker, GOMAXPROCS=1). WORKLOADS="sse16-c32 ..." runs only those of
# chat-c32 chat-c1 sse16-c32 chat-90k-c1.
# It prints the table and writes it to benchmarks/results/peers.md.
set -euo pipefail
cd "$(dirname "$0")/.."
args=("$@")
secs=${1:-5}; shift || true
proxies=${*:-direct warmroute bare relay nginx haproxy}
for tool in nginx haproxy wrk taskset go; do
  command -v $tool >/dev/null || { echo "peers.sh needs $tool: apt-get install nginx haproxy wrk" >&2; exit 2; }
done
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; pkill -f "$tmp" 2>/dev/null || true; sleep 0.2; rm -rf "$tmp"; }
trap cleanup EXIT
. scripts/record.sh
record peers "ROUNDS WORKLOADS SHARED WARMROUTE_BIN WARMROUTE_BASE" "${args[@]}"
if [ -n "${WARMROUTE_BIN:-}" ]; then cp "$WARMROUTE_BIN" "$tmp/warmroute"; else go build -o "$tmp/warmroute" .; fi
if [ -n "${WARMROUTE_BASE:-}" ]; then cp "$WARMROUTE_BASE" "$tmp/warmroute-base"; fi
go build -o "$tmp/fakeupstream" ./benchmarks/cmd/fakeupstream
go build -o "$tmp/loadgen" ./benchmarks/cmd/loadgen
go build -o "$tmp/bareproxy" ./benchmarks/cmd/bareproxy
go build -o "$tmp/gorelay" ./benchmarks/cmd/gorelay
"$tmp/loadgen" -print-body -body 1800 -turns 1 >"$tmp/small.json"       # 3 messages, about 2 KB
"$tmp/loadgen" -print-body -body 360000 -turns 1 >"$tmp/big.json"       # about 90k tokens
"$tmp/loadgen" -print-body -body 1800 -turns 1 -stream >"$tmp/sse.json"

u1=127.0.0.1:19001 u2=127.0.0.1:19002 front=127.0.0.1:19080
pin0="taskset -c 0" pin1="taskset -c 1"
[ -n "${SHARED:-}" ] && pin0="" pin1=""
for port in 19001 19002 19080; do
  if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then echo "port $port is in use; stop what holds it" >&2; exit 2; fi
done
GOMAXPROCS=1 $pin1 "$tmp/fakeupstream" -listen $u1 & pids+=($!)
GOMAXPROCS=1 $pin1 "$tmp/fakeupstream" -listen $u2 & pids+=($!)

scripts/nginx-conf.sh "$tmp" $front $u1 $u2 >"$tmp/nginx.conf"
cat >"$tmp/haproxy.cfg" <<HAPROXY
global
  nbthread 1
  maxconn 8000
defaults
  mode http
  timeout connect 2s
  timeout client 60s
  timeout server 60s
  http-reuse always
frontend f
  bind $front
  default_backend b
backend b
  balance roundrobin
  server s1 $u1
  server s2 $u2
HAPROXY

start_proxy() {
  case $1 in
    direct) echo "" ;;
    warmroute) GOMAXPROCS=1 $pin0 "$tmp/warmroute" -listen $front -admin-listen "" -upstream "http://$u1,http://$u2" -log-level warn -drain-delay 0 >/dev/null 2>"$tmp/warmroute.log" & echo $! ;;
    base) [ -x "$tmp/warmroute-base" ] || { echo "proxy base needs WARMROUTE_BASE=path" >&2; exit 2; }
      GOMAXPROCS=1 $pin0 "$tmp/warmroute-base" -listen $front -admin-listen "" -upstream "http://$u1,http://$u2" -log-level warn -drain-delay 0 >/dev/null 2>"$tmp/warmroute-base.log" & echo $! ;;
    bare) GOMAXPROCS=1 $pin0 "$tmp/bareproxy" -listen $front -upstream "$u1,$u2" >/dev/null 2>&1 & echo $! ;;
    relay) GOMAXPROCS=1 $pin0 "$tmp/gorelay" -listen $front -upstream "$u1,$u2" >/dev/null 2>&1 & echo $! ;;
    nginx) $pin0 nginx -c "$tmp/nginx.conf" -e "$tmp/nginx-error.log" -p "$tmp" >/dev/null 2>&1 & echo $! ;;
    haproxy) $pin0 haproxy -f "$tmp/haproxy.cfg" -db >/dev/null 2>"$tmp/haproxy.log" & echo $! ;;
  esac
}
# cpu_ticks sums user+system clock ticks of a process and its children.
cpu_ticks() {
  local total=0 p
  [ -z "$1" ] && { echo 0; return; }
  for p in $1 $(pgrep -P "$1" || true); do
    [ -r /proc/$p/stat ] || continue
    total=$((total + $(awk '{print $14+$15}' /proc/$p/stat)))
  done
  echo $total
}
hz=$(getconf CLK_TCK)
to_us() { awk -v v="$1" 'BEGIN{ if (v ~ /us$/) {sub(/us/,"",v); print v+0} else if (v ~ /ms$/) {sub(/ms/,"",v); print v*1000} else if (v ~ /s$/) {sub(/s/,"",v); print v*1e6} else print v }'; }

printf '%-10s %-22s %10s %12s %9s %9s %9s %7s\n' proxy workload req/s req/s/core p50_us p99_us +p50_us errors | tee "$tmp/table"
declare -A base
run() { # proxy pid workload
  local proxy=$1 pid=$2 name=$3 target=$front rps p50 p99 errs t0 t1 core perc
  [ "$proxy" = direct ] && target=$u1
  t0=$(cpu_ticks "$pid")
  case $name in
    chat-c32|chat-c1|chat-90k-c1)
      local c=32 body=$tmp/small.json
      [ "$name" = chat-c1 ] && c=1
      [ "$name" = chat-90k-c1 ] && { c=1; body=$tmp/big.json; }
      BODY=$body $pin1 wrk -t1 -c$c -d${secs}s --latency -s scripts/post.lua "http://$target/v1/chat/completions" >"$tmp/out" 2>&1 || true
      rps=$(awk '/Requests\/sec/{print $2}' "$tmp/out")
      p50=$(to_us "$(awk '$1=="50%"{print $2}' "$tmp/out")")
      p99=$(to_us "$(awk '$1=="99%"{print $2}' "$tmp/out")")
      errs=$(awk '/Non-2xx|Socket errors/{s+=$NF} END{print s+0}' "$tmp/out")
      ;;
    sse16-c32)
      $pin1 "$tmp/loadgen" -url "http://$target/v1/chat/completions" -c 32 -d ${secs}s -stream -body 1800 -turns 1 >"$tmp/out" 2>&1 || true
      rps=$(sed -n 's/.*rps=\([0-9]*\).*/\1/p' "$tmp/out" | head -1)
      p50=$(sed -n 's/.*p50_us=\([0-9]*\).*/\1/p' "$tmp/out" | head -1)
      p99=$(sed -n 's/.*p99_us=\([0-9]*\).*/\1/p' "$tmp/out" | head -1)
      errs=$(sed -n 's/.*errors=\([0-9]*\).*/\1/p' "$tmp/out" | head -1)
      ;;
  esac
  t1=$(cpu_ticks "$pid")
  core="-"; perc="-"
  if [ -n "$pid" ] && [ "$t1" -gt "$t0" ]; then
    core=$(awk -v r="$rps" -v s="$secs" -v d=$((t1-t0)) -v hz="$hz" 'BEGIN{printf "%.0f", r*s/(d/hz)}')
  fi
  [ "$proxy" = direct ] && base[$name]=$p50
  perc=$(awk -v a="$p50" -v b="${base[$name]:-}" 'BEGIN{ if (b=="") print "-"; else printf "%+.0f", a-b }')
  printf '%-10s %-22s %10s %12s %9s %9s %9s %7s\n' "$proxy" "$name" "$rps" "$core" "$p50" "$p99" "$perc" "${errs:-?}" | tee -a "$tmp/table"
}
rounds=${ROUNDS:-1}
for round in $(seq "$rounds"); do
for proxy in $proxies; do
  pid=$(start_proxy $proxy)
  [ -n "$pid" ] && pids+=("$pid")
  for _ in $(seq 50); do curl -fs -o /dev/null -X POST --data-binary @"$tmp/small.json" "http://${front}/v1/chat/completions" 2>/dev/null && break; [ "$proxy" = direct ] && break; sleep 0.1; done
  for w in ${WORKLOADS:-chat-c32 chat-c1 sse16-c32 chat-90k-c1}; do run "$proxy" "$pid" "$w"; done
  [ -n "$pid" ] && { kill "$pid" 2>/dev/null; pkill -P "$pid" 2>/dev/null || true; }
  # The proxy was started in a subshell, so wait cannot wait for it: the
  # next one starts once this one has let go of the port.
  for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/${front##*:}) 2>/dev/null || break; sleep 0.1; done
  sleep 0.5
done
done
if [ "$rounds" -gt 1 ]; then
  echo
  echo "median of $rounds rounds:"
  printf '%-10s %-22s %10s %12s %9s %9s %9s %7s\n' proxy workload req/s req/s/core p50_us p99_us +p50_us errors
  awk 'NR>1 && $1!="proxy" {k=$1" "$2; if (!(k in seen)) {order[++n]=k; seen[k]=1}; for (c=3;c<=8;c++) v[k,c,++cnt[k,c]]=$c}
    function med(k,c,   m,i,j,t,a) { m=cnt[k,c]; for(i=1;i<=m;i++) a[i]=v[k,c,i]; for(i=1;i<=m;i++) for(j=i+1;j<=m;j++) if (a[j]+0<a[i]+0) {t=a[i];a[i]=a[j];a[j]=t}; return a[int((m+1)/2)] }
    END { for (i=1;i<=n;i++) { split(order[i],p," "); printf "%-10s %-22s %10s %12s %9s %9s %9s %7s\n", p[1], p[2], med(order[i],3), med(order[i],4), med(order[i],5), med(order[i],6), med(order[i],7), med(order[i],8) } }' "$tmp/table"
fi
echo
echo "date: $(date -u +%F) | $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) | $(nginx -v 2>&1) | $(haproxy -v | head -1) | $(go version)"
echo "req/s/core: requests divided by the proxy process's CPU seconds; +p50_us: p50 added to going straight to one upstream."
record_end
