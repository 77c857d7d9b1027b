"""moa_cpp's benchmarks: speed and acceptance measured against what a user would run instead.

Run from the repository's root, one entry point per question (bench/README.md maps questions to
commands and result files):

    python -m bench.eval      run | spec-types | policy-replay | near-tie     (the paper's evaluation sets)
    python -m bench.costs     loop | curves | draft-step | capture | calibration | batch-invariance | gguf-read | features
    python -m bench.process   startup | first-run                             (whole `moa-cpp generate` processes)
    python -m bench.serve     load | prompt-cache | examples | page-shot      (`moa-cpp serve`)
    python -m bench.peers     [options]                                       (llama.cpp's own tools, one table)
    python -m bench.remote    sim | bytes                                     (client-server MoA)
    python -m bench.gpu       pack | check                                    (the GPU check: bench/gpu_check.sh)

The shared library is :mod:`bench.common` (results files, machine labels, prompts, the
llama-cpp-python baseline) and :mod:`bench.proxy` (the GPU-speed proxy target).
"""
