"""python -m bench.peers [options]: llama.cpp's own tools (built by bench/peers/build.sh) next to moa_cpp."""
from bench import common
from bench.peers import compare

if __name__ == "__main__":
    common.INVOCATION[:] = ["-m", "bench.peers"]
    raise SystemExit(compare.main())
