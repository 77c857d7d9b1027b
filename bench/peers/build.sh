#!/usr/bin/env bash
# Builds llama.cpp's own tools -- the peers a llama.cpp user compares moa_cpp with -- from the
# llama.cpp that the sdist of llama-cpp-python==0.3.36 vendors: the same ggml our library links.
# Bench-only: never run by setup or CI. Built once into a cache; later runs print the path and exit.
#
#   bash bench/peers/build.sh            -> prints the folder holding llama-server, llama-bench, ...
#   MOA_PEERS_DIR=DIR                       cache folder (default ~/.cache/moa_cpp/peers)
#   MOA_PEERS_SDIST=FILE                    the sdist (default: pip's cache, /tmp, else `pip download`)
#   MOA_PEERS_JOBS=N                        build jobs (default: all cores)
#
# Flags: those of scripts/setup.sh's llama-cpp-python build (RPC on, the native CPU build minus AMX
# where scripts/llama_cpu_flags.sh says so), Release, no curl / OpenSSL / web-UI download (offline).
# Measured on the 2-core AMD EPYC: 366 s the first time (6 tools, 227 build steps).
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=0.3.36
TOOLS="llama-server llama-speculative-simple llama-lookup llama-bench llama-batched-bench llama-cli"
ROOT="${MOA_PEERS_DIR:-$HOME/.cache/moa_cpp/peers}/llama-cpp-python-$VERSION"
CPU_FLAGS=$(bash scripts/llama_cpu_flags.sh)
STAMP="$ROOT/bin/.built-with"
WANT="$TOOLS | -DGGML_RPC=ON $CPU_FLAGS"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then echo "$ROOT/bin"; exit 0; fi

find_sdist() {
  [ -n "${MOA_PEERS_SDIST:-}" ] && { echo "$MOA_PEERS_SDIST"; return; }
  local f
  f=$(find "$HOME/.cache/pip" /tmp -name "llama_cpp_python-$VERSION.tar.gz" 2>/dev/null | head -n 1 || true)
  if [ -z "$f" ]; then
    mkdir -p "$ROOT/sdist"
    echo "downloading the sdist of llama-cpp-python==$VERSION (76 MB)" >&2
    python3 -m pip download -q --no-deps --no-binary :all: --no-build-isolation -d "$ROOT/sdist" \
      "llama-cpp-python==$VERSION" >&2
    f=$(ls "$ROOT"/sdist/llama_cpp_python-$VERSION.tar.gz)
  fi
  echo "$f"
}
SDIST=$(find_sdist)
# pip's http cache stores bodies without names: a cached sdist is found by the wheel build's unpack
[ -f "$SDIST" ] || { echo "sdist not found: $SDIST (set MOA_PEERS_SDIST)" >&2; exit 2; }
SRC="$ROOT/src/llama_cpp_python-$VERSION/vendor/llama.cpp"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  mkdir -p "$ROOT/src"
  echo "unpacking $SDIST" >&2
  tar xzf "$SDIST" -C "$ROOT/src" "llama_cpp_python-$VERSION/vendor/llama.cpp"
fi
start=$(date +%s)
echo "building $TOOLS (once; ~6 min on 2 cores) in $ROOT/build" >&2
cmake -S "$SRC" -B "$ROOT/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DGGML_RPC=ON $CPU_FLAGS -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON \
  -DLLAMA_BUILD_SERVER=ON >&2
cmake --build "$ROOT/build" -j "${MOA_PEERS_JOBS:-$(nproc)}" --target $TOOLS >&2
mkdir -p "$ROOT/bin"
for t in $TOOLS; do cp "$ROOT/build/bin/$t" "$ROOT/bin/"; done
echo "$WANT" > "$STAMP"
echo "built in $(( $(date +%s) - start )) s" >&2
echo "$ROOT/bin"
