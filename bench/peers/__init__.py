"""llama.cpp's own tools next to moa_cpp, one table (python -m bench.peers; the tools: bash bench/peers/build.sh)."""
