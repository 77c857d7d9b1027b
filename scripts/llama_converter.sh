#!/usr/bin/env bash
# llama.cpp's own HF -> GGUF converter, as vendored by llama-cpp-python==0.3.36 (the llama.cpp we
# link): convert_hf_to_gguf.py, conversion/ and gguf-py/, extracted from the sdist once into
# ~/.cache/moa_cpp/llama-convert-0.3.36 ($MOA_LLAMA_CONVERTER overrides). The per-architecture
# checks (tests/format/test_archs.py) convert their tiny transformers checkpoints with it.
# The sdist: $MOA_LLAMA_SDIST, pip's unpack folders under /tmp, else `pip download` (76 MB, once).
set -euo pipefail
VERSION=0.3.36
CACHE="${MOA_CPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/moa_cpp}"
DEST="${MOA_LLAMA_CONVERTER:-$CACHE/llama-convert-$VERSION}"
[ -f "$DEST/convert_hf_to_gguf.py" ] && exit 0
SDIST="${MOA_LLAMA_SDIST:-}"
if [ -z "$SDIST" ]; then
  SDIST=$(ls "$CACHE"/sdist/llama_cpp_python-$VERSION.tar.gz /tmp/pip-unpack-*/llama_cpp_python-$VERSION.tar.gz 2>/dev/null | head -n 1 || true)
fi
if [ -z "$SDIST" ]; then
  echo "downloading the sdist of llama-cpp-python==$VERSION (76 MB, once) for llama.cpp's converter" >&2
  mkdir -p "$CACHE/sdist"
  python3 -m pip download -q --no-deps --no-binary :all: --no-build-isolation -d "$CACHE/sdist" \
    "llama-cpp-python==$VERSION" 2>/dev/null || true
  SDIST="$CACHE/sdist/llama_cpp_python-$VERSION.tar.gz"
fi
[ -f "$SDIST" ] || { echo "llama-cpp-python $VERSION sdist not found (set MOA_LLAMA_SDIST)" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
P=llama_cpp_python-$VERSION/vendor/llama.cpp
tar -xzf "$SDIST" -C "$TMP" "$P/convert_hf_to_gguf.py" "$P/conversion" "$P/gguf-py"
mkdir -p "$(dirname "$DEST")"
rm -rf "$DEST.tmp" && mv "$TMP/$P" "$DEST.tmp" && mv "$DEST.tmp" "$DEST"
echo "llama.cpp's converter: $DEST"
