#!/usr/bin/env bash
# Runs warmroute's benchmarks against two real llama-server replicas with
# the tiny model of scripts/llama-engine.sh (built first if it is not),
# each on one CPU thread, through `go test -bench ... -args -upstream`.
#
#   scripts/bench-llama.sh                        # the agent loop, every policy, once
#   scripts/bench-llama.sh 'ColdBurst|Mixed' -workload-scale 0.02
#
# The first argument is go test's -bench pattern (AgentLoop by default);
# the rest go to the benchmarks after -args (-workload-scale 0.02 unless
# given: the seed's 90k-token context scaled to about 3k of the tiny
# model's tokens, which it prefills in about two seconds on one core). Logs of the replicas go
# to $TMPDIR.
set -euo pipefail
cd "$(dirname "$0")/.."
engine=${WARMROUTE_ENGINE:-$(scripts/llama-engine.sh)}
pattern=${1:-AgentLoop}
shift || true
args=("$@")
case " ${args[*]-} " in
  *" -workload-scale "*) ;;
  *) args+=(-workload-scale 0.02) ;;
esac

pids=()
stop() { if [ ${#pids[@]} -gt 0 ]; then kill "${pids[@]}" 2>/dev/null || true; wait "${pids[@]}" 2>/dev/null || true; fi; }
trap stop EXIT
urls=()
for port in "${LLAMA_PORT1:-18181}" "${LLAMA_PORT2:-18182}"; do
  "$engine/llama-server" -m "$engine/tiny.gguf" --alias warmroute-tiny \
    --host 127.0.0.1 --port "$port" -c 32768 --parallel 2 --threads 1 \
    --no-webui --seed 1 >"${TMPDIR:-/tmp}/llama-server-$port.log" 2>&1 &
  pids+=($!)
  urls+=("http://127.0.0.1:$port")
done
for u in "${urls[@]}"; do
  for _ in $(seq 300); do
    if curl -sf "$u/health" >/dev/null 2>&1; then break; fi
    sleep 0.2
  done
  curl -sf "$u/health" >/dev/null || { echo "$u did not come up" >&2; exit 1; }
done
upstream=$(IFS=,; echo "${urls[*]}")
go test ./benchmarks -run '^$' -bench "$pattern" -benchtime 1x -timeout 30m -args -upstream "$upstream" "${args[@]}"
