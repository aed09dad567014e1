#!/usr/bin/env bash
# Runs the policy table: every -routing policy and the peers' re-implemented
# ones (SGLang's cache-aware rule, llm-d's scorers, least load, power of two)
# on the table's workloads (the seed's agent loop, cold burst and mixed run;
# skewed sessions, a hot spot, a shared-prompt burst), each on 2 and 4
# simulated replicas, POLICY_RUNS runs each (default 3), and rewrites
# benchmarks/results/policies.md: the command and date on top, then the
# medians (min-max) of p50/p90/worst TTFT and makespan, and the default policy
# against the best of each workload.
#   scripts/policies.sh                  time scale 20, 3 runs (about 25 min)
#   SIM_SCALE=40 POLICY_RUNS=1 scripts/policies.sh   a quick look
set -euo pipefail
cd "$(dirname "$0")/.."
scale=${SIM_SCALE:-20}
runs=${POLICY_RUNS:-3}
out=benchmarks/results/policies.md
bench='Policies/(agent|burst|mixed|skewed|hotspot|shared)-[24]/'
cmd="go test -run '^\$' -bench '$bench' -benchtime 1x -timeout 2h ./benchmarks/ -args -sim-scale $scale -policy-runs $runs"
# Whether the code differs from HEAD: results files, this one or another
# script's written first, are not what is measured.
dirty=$(git diff --quiet HEAD -- . ":(exclude)benchmarks/results" || echo ' (with uncommitted changes)')
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
eval "$cmd" | tee "$raw"
{
	echo "# Policies by workload"
	echo
	echo "$(date -u '+%F %H:%M UTC'), commit $(git rev-parse --short HEAD)$dirty, written by scripts/policies.sh:"
	echo
	echo '```'
	echo "$cmd"
	echo '```'
	echo
	echo "Simulated vLLM replicas (benchmarks/sim DefaultConfig) at time scale $scale, behind one"
	echo "warmroute instance. Each cell: median over $runs runs (min-max). TTFT on the engines'"
	echo "clocks, of every request, except skewed (the twenty short conversations' requests) and"
	echo "hotspot (the fresh requests'); makespan on the client's clock times the scale."
	echo "sglang, llmd, least and p2c are the peers' policies re-implemented in"
	echo "benchmarks/peers_test.go; they are not -routing values."
	echo
	sed -n '/^| workload | replicas | policy/,$p' "$raw" | sed '/^The seed.s table/,$d' | grep -v '^ok \|^PASS$'
} >"$out"
echo "wrote $out"
