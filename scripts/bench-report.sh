#!/usr/bin/env bash
# Runs the routing benchmarks against simulated replicas and writes
# bench-report.md and bench-chart.svg (drawn locally, no network).
#   scripts/bench-report.sh [DIR]   (default: benchmarks/results/$(date +%F))
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-benchmarks/results/$(date +%F)}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
go test -run '^$' -bench . -benchtime 1x ./benchmarks/ -args -report "$dir" | tee "$dir/bench-output.txt"
echo "wrote $dir/bench-report.md and $dir/bench-chart.svg"
