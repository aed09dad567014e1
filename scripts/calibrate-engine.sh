#!/usr/bin/env bash
# Measures a real engine (llama-server with the tiny model of
# scripts/llama-engine.sh, built first if it is not) and holds the simulator
# to it: cold prefill at three prompt sizes, the decode rate, and the
# warm/cold TTFT ratio of a conversation's second turn, on llama-server and
# on the simulator given the fitted rates (benchmarks/calibration_test.go,
# TestSimCalibration). Prints the measured figures; fails when the
# simulator's ratios leave the test's band.
set -euo pipefail
cd "$(dirname "$0")/.."
WARMROUTE_ENGINE=${WARMROUTE_ENGINE:-$(scripts/llama-engine.sh)}
export WARMROUTE_ENGINE
go test ./benchmarks -run '^TestSimCalibration$' -count 1 -v | grep -E 'calibration_test|^(---|ok|FAIL)'
