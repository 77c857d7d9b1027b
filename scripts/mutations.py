#!/usr/bin/env python3
"""Plant known bugs and check that the suite catches each one (a suite that passes on a broken
sampler proves nothing). Every mutation is applied to a scratch git worktree of HEAD, never to
this checkout, and the tests named for it run there in-process; a mutation the tests survive is
reported as MISSED and the script exits 1.

    .venv/bin/python scripts/mutations.py            # all
    .venv/bin/python scripts/mutations.py M1 M3      # some

Takes ~10 minutes on 2 cores (mostly M1's SmolLM2 lossless checks). Run it alone: the tests load
real models.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# name: (file, text to replace (must occur once), replacement, pytest arguments, what it plants)
MUTATIONS = {
    "M1": ("moa_cpp/speculative/verify.py",
           "        nxt = next((c for c in children[row] if int(proposal.tokens[c]) == want), None)",
           "        second = int(np.argsort(-np.asarray(target_logits[row]))[1])\n"
           "        nxt = next((c for c in children[row] if int(proposal.tokens[c]) in (want, second)), None)",
           ["tests/speculative/test_lossless.py", "-k", "oracle and smollm2-q4_1"],
           "greedy verifier also accepts the target's second choice"),
    "M2a": ("moa_cpp/speculative/verify.py", "x = np.asarray(logits, dtype=np.float64) / sp.temperature",
            "x = np.asarray(logits, dtype=np.float64)",
            ["tests/speculative/test_sampling.py", "tests/speculative/test_sampling_reference.py"], "sampling ignores the temperature"),
    "M2b": ("moa_cpp/speculative/verify.py", "kth = np.partition(x, -sp.top_k)[-sp.top_k]",
            "kth = np.sort(x)[-(sp.top_k - 1)] if sp.top_k > 1 else x.max()",
            ["tests/speculative/test_sampling.py", "tests/speculative/test_sampling_reference.py"], "top-k keeps k - 1 tokens"),
    "M2c": ("moa_cpp/speculative/verify.py", "keep = c - p[order] < sp.top_p",
            "keep = np.roll(c - p[order] < sp.top_p, 1); keep[0] = True",
            ["tests/speculative/test_sampling.py", "tests/speculative/test_sampling_reference.py"], "top-p keeps one token too many"),
    "M3": ("moa_cpp/speculative/proposers/moa.py", "qs.append(q)", "qs.append(qs[0] if qs else q)",
           ["tests/cli/test_generate.py", "-k", "own_q or sampling"], "MoA chain drafts at depth >= 2 carry the root's q"),
    "M3dm": ("moa_cpp/speculative/proposers/draft_model.py", "qs.append(q)", "qs.append(qs[0] if qs else q)",
             ["tests/speculative/test_sampling_e2e.py", "-k", "chain"], "draft-model drafts at depth >= 2 carry the root's q"),
    "M4": ("moa_cpp/speculative/verify.py", "                p[x] = 0.0", "                pass",
           ["tests/speculative/test_sampling_e2e.py", "-k", "tree"], "a rejected deterministic sibling keeps its mass"),
    "M5": ("moa_cpp/speculative/loop.py", "        scores.logits = _eog_masked(scores.logits, self.target, g.sp)\n", "",
           ["tests/speculative/test_lossless.py", "-k", "ignore_eos and smollm2-q4_1"],
           "ignore_eos masks plain decoding's rows but not verification rows"),
}

# pytest in the worktree: drop the editable install's import redirect so that the worktree's
# moa_cpp is imported (the native library is found through the installed distribution)
RUNNER = ("import sys\n"
          "sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != 'ScikitBuildRedirectingFinder']\n"
          "sys.path.insert(0, sys.argv[1])\n"
          "import pytest\n"
          "sys.exit(pytest.main(['-q', '-x', '-p', 'no:cacheprovider'] + sys.argv[2:]))\n")


def main(names: list[str]) -> int:
    names = names or list(MUTATIONS)
    unknown = [n for n in names if n not in MUTATIONS]
    if unknown:
        print(f"unknown mutation(s) {unknown}; known: {', '.join(MUTATIONS)}", file=sys.stderr)
        return 2
    env = {**os.environ, "MOA_FIXTURE_DIR": os.environ.get("MOA_FIXTURE_DIR",
                                                           str(REPO.parent / "shared" / "fixtures" / "moa-ref-tiny"))}
    missed = []
    with tempfile.TemporaryDirectory(prefix="moa-mut-") as tmp:
        wt = Path(tmp) / "wt"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(wt), "HEAD"], check=True)
        (Path(tmp) / "run.py").write_text(RUNNER)
        try:
            for name in names:
                rel, old, new, args, what = MUTATIONS[name]
                f = wt / rel
                src = f.read_text()
                if src.count(old) != 1:
                    print(f"{name}: the text to mutate occurs {src.count(old)} times in {rel}: update this table")
                    missed.append(name)
                    continue
                f.write_text(src.replace(old, new))
                try:
                    p = subprocess.run([sys.executable, str(Path(tmp) / "run.py"), str(wt), *args], cwd=wt, env=env,
                                       capture_output=True, text=True, timeout=1800)
                finally:
                    f.write_text(src)
                last = (p.stdout.strip().splitlines() or ["(no output)"])[-1]
                caught = p.returncode == 1
                print(f"{name:5s} {'caught' if caught else 'MISSED'}  {what}: {' '.join(args)} -> {last}", flush=True)
                if not caught:
                    missed.append(name)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(wt)], check=False)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
