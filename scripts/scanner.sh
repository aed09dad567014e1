#!/usr/bin/env bash
# Speed of the canonical scanner (prefixcache.Chains.Read) on a 90k-token,
# 40-message chat body of source code, with links every 256 bytes and at
# message ends only, and on one of prose, beside
# valyala/fastjson parsing the same body and encoding/json decoding it into
# a struct; COUNT runs of each (default 3). Prints go test's lines and
# writes them to benchmarks/results/scanner.md.
#   scripts/scanner.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. scripts/record.sh
record scanner "COUNT" "$@"
go test -run '^$' -bench 'Chains$|ChainsProse|FastjsonBaseline|JSONUnmarshalBaseline' \
  -benchmem -count "${COUNT:-3}" ./prefixcache
record_end
