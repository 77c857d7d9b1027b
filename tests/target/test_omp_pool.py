"""One-off llama.cpp work runs on a thread that ends with it, so that its OpenMP worker threads end
too (moa_cpp/target/omp_pool.py): a server that calibrates at start and then generates on its session
thread holds one libgomp pool, not two (two made libgomp sleep at every barrier: issue 42)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from moa_cpp.target.omp_pool import run_in_passing_thread


def test_result_and_error_come_back():
    import threading
    main = threading.get_ident()
    assert run_in_passing_thread(lambda a, b=0: (a + b, threading.get_ident() != main), 2, b=3) == (5, True)
    with pytest.raises(KeyError, match="boom"):
        run_in_passing_thread(lambda: {}["boom"])


_CHILD = textwrap.dedent("""
    import os, sys, threading, time, llama_cpp
    from concurrent.futures import ThreadPoolExecutor
    from moa_cpp.models import registry as models
    from moa_cpp.generator import SpeculativeGenerator
    from moa_cpp.cli.generate import prefill_shape

    def tasks(expect=None):
        # threads end a moment after join() returns (libgomp's pool is freed by the thread's exit)
        for _ in range(100):
            n = len(os.listdir("/proc/self/task"))
            if expect is None or n <= expect:
                break
            time.sleep(0.05)
        return n

    gen = SpeculativeGenerator.from_paths(str(models.smollm2_path()), n_ctx=512, n_threads=2, spec_type="ngram",
                                          draft="auto:4")
    before = tasks()
    gen.calibrate()                 # T(k) + exact batch size: decodes (2 threads)
    prefill_shape(gen)
    after = tasks(before)
    # the control: the same decodes on a thread that stays alive keep its OpenMP worker alive
    ex = ThreadPoolExecutor(1)
    ex.submit(gen.loop.calibrate).result()
    kept = tasks()
    print(before, after, kept, b"OPENMP = 1" in llama_cpp.llama_print_system_info())
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc/self/task")
def test_calibration_leaves_no_openmp_threads(tmp_path):
    env = {**os.environ, "MOA_CPP_CACHE": str(tmp_path)}      # a calibration of its own, never the user's
    r = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    before, after, kept, openmp = r.stdout.split()[-4:]
    assert int(after) == int(before), r.stdout
    if openmp == "True":        # the control shows what is at stake (OpenMP builds only)
        assert int(kept) >= int(before) + 2, r.stdout
