#!/usr/bin/env bash
# Runs the routing benchmarks against simulated replicas and rewrites
# benchmarks/results/bench-report.md, which starts with the command and the
# date, and the chart it shows, bench-chart.svg (drawn locally, no network):
# per-turn TTFT of the agent loop on a log10 axis, and the cold burst's
# makespan, for every policy measured, captioned with the replicas and time
# scale; and the policy table: every workload under ours and the peers'
# policies, three runs each (POLICY_RUNS), with the spread over the runs.
#   scripts/bench-report.sh [DIR]   (default: benchmarks/results)
#   SIM_SCALE=20 scripts/bench-report.sh   replicas 20x faster than real time
#                                          (default: the -sim-scale flag's)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-benchmarks/results}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
go test -run '^$' -bench . -benchtime 1x ./benchmarks/ -timeout 3h -args -report "$dir" -policy-runs "${POLICY_RUNS:-3}" ${SIM_SCALE:+-sim-scale "$SIM_SCALE"}
echo "wrote $dir/bench-report.md and $dir/bench-chart.svg"
