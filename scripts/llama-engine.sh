#!/usr/bin/env bash
# Builds a real inference engine for the tests, once: llama.cpp's
# llama-server (CPU only, Release, only that target) and a tiny GGUF model
# with a real tokenizer vocabulary and random weights (scripts/tiny-gguf.py).
#
# llama.cpp's source comes from the npm package node-llama-cpp, which ships
# it as a git bundle (llama/gitRelease.bundle); the model's vocabulary and
# the gguf Python package (gguf-py) come from that source tree, numpy from
# Debian's python3-numpy. Both land in
#   ${WARMROUTE_ENGINE_DIR:-$HOME/.cache/warmroute-engine}/<key>/
# keyed by the package's version (which pins llama.cpp's source) and the
# machine; <dir>/current links to the last one built. It prints that
# directory: the tests read it from WARMROUTE_ENGINE, or find the current
# link by themselves.
#
#   scripts/llama-engine.sh            # build unless built; print the directory
#   JOBS=4 scripts/llama-engine.sh     # more compile jobs (default 2)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=3.22.1 # node-llama-cpp
base=${WARMROUTE_ENGINE_DIR:-$HOME/.cache/warmroute-engine}
# The model's script is part of the key: a change to it makes a new model.
key="node-llama-cpp-$version-$(uname -m)-model-$(sha256sum "$here/tiny-gguf.py" | cut -c1-8)"
out="$base/$key"
mkdir -p "$base"
if [ -x "$out/llama-server" ] && [ -f "$out/tiny.gguf" ]; then
  ln -sfn "$key" "$base/current"
  echo "$out"
  exit 0
fi

# The build's tools, from Debian where they are missing.
missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
command -v git >/dev/null 2>&1 || missing+=(git)
command -v npm >/dev/null 2>&1 || missing+=(npm)
/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1 || missing+=(python3-numpy)
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

work=$(mktemp -d "$base/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
npm pack --silent "node-llama-cpp@$version" >/dev/null
tar xzf node-llama-cpp-*.tgz package/llama/gitRelease.bundle package/llama/llama.cpp.info.json
git -c advice.detachedHead=false clone -q package/llama/gitRelease.bundle src
commit=$(git -C src rev-parse HEAD)

start=$(date +%s)
cmake -S src -B build -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=ON -DGGML_OPENMP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >cmake.log 2>&1 || { cat cmake.log; exit 1; }
cmake --build build --target llama-server -j"${JOBS:-2}" >build.log 2>&1 || { tail -50 build.log; exit 1; }
built=$(date +%s)

mkdir -p stage
cp build/bin/llama-server stage/
PYTHONPATH=src/gguf-py /usr/bin/python3 "$here/tiny-gguf.py" src/models/ggml-vocab-llama-spm.gguf stage/tiny.gguf
{
  echo "node-llama-cpp $version"
  echo "llama.cpp $(tr -d '\n ' <package/llama/llama.cpp.info.json) source $commit"
  echo "llama-server built in $((built - start)) s with ${JOBS:-2} jobs"
} >stage/VERSION
rm -rf "$out"
mv stage "$out"
ln -sfn "$key" "$base/current"
cat "$out/VERSION" >&2
echo "$out"
