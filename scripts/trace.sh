#!/usr/bin/env bash
# Replays the checked-in Mooncake conversation trace (BenchmarkTrace,
# benchmarks/trace_test.go) through warmroute under every -routing policy
# and through the peers' rules re-implemented in benchmarks/ (SGLang's
# cache-aware rule and llm-d's approximate prefix scorer, over 64-byte
# chunks of the text), both renderings (turns as chat, each prompt one
# message), on two simulated replicas with KV for the whole window and
# with 500k tokens each, and rewrites benchmarks/results/trace.md: the
# command and date on top, then each router's cached share of prompt
# tokens beside the best reachable, and its TTFT. Extra arguments go to
# the benchmark (after -args): -trace FILE, -trace-start, -trace-count,
# -trace-window, -trace-time, -trace-length, -trace-kv, -trace-replicas,
# -trace-render, -upstream URLS.
#   scripts/trace.sh                       time scale 20 (about 6 min on 2 cores)
#   SIM_SCALE=40 scripts/trace.sh          a quick look (2 cores lag behind its clock)
set -euo pipefail
cd "$(dirname "$0")/.."
scale=${SIM_SCALE:-20}
out=benchmarks/results/trace.md
cmd="go test -run '^\$' -bench 'Trace/' -benchtime 1x -timeout 1h ./benchmarks/ -args -sim-scale $scale"
for a in "$@"; do cmd+=" $(printf '%q' "$a")"; done
# Whether the code differs from HEAD: results files, this one or another
# script's written first, are not what is measured.
dirty=$(git diff --quiet HEAD -- . ":(exclude)benchmarks/results" || echo ' (with uncommitted changes)')
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
eval "$cmd" | tee "$raw"
{
	echo "# Trace replay"
	echo
	echo "$(date -u '+%F %H:%M UTC'), commit $(git rev-parse --short HEAD)$dirty, $(nproc) CPUs, written by scripts/trace.sh:"
	echo
	echo '```'
	echo "$cmd"
	echo '```'
	echo
	echo "The Mooncake conversation trace (benchmarks/traces), one run of each router, behind one"
	echo "warmroute instance for cost, adaptive, affinity and roundrobin; sglang and llmd-approx are"
	echo "the peers' rules re-implemented in benchmarks/chunkpeers_test.go, routing over 64-byte"
	echo "chunks of the prompt's text in a router of their own. Renderings: chat, a request that"
	echo "extends an earlier one continues its conversation as chat messages; single, each prompt"
	echo "one message. Cached share: the prompt tokens that the replicas reported cached"
	echo "(usage.prompt_tokens_details.cached_tokens) over all prompt tokens; of best: that share"
	echo "over the best any router could reach (the trace's shared blocks over its prompt blocks)."
	echo "TTFT on the engines' clocks (the client's on -upstream replicas)."
	echo
	sed -n '/^Trace replay (/,$p' "$raw" | grep -v '^ok \|^PASS$'
} >"$out"
echo "wrote $out"
