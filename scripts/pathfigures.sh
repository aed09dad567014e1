#!/usr/bin/env bash
# Prints how far a request's code is spread: the files and the calls from
# one file into another that a chat request and an SSE stream can reach
# through router/, the file pairs that call each other back, the longest
# functions, and the test files (benchmarks/cmd/pathfigures says how).
#   scripts/pathfigures.sh
set -euo pipefail
cd "$(dirname "$0")/.."
go run ./benchmarks/cmd/pathfigures
