"""Small helpers shared by tests (not fixtures): GGUF rewriting for bad-input tests."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import gguf
import numpy as np


def rewrite_gguf(src: Path, dst: Path, *, kv: Optional[dict] = None, drop_tensors: tuple = (),
                 tensor_fn: Optional[Callable[[str, np.ndarray], np.ndarray]] = None, arch: Optional[str] = None) -> Path:
    """Copy a GGUF, overriding u32/f32/str metadata (``kv``), dropping or transforming tensors."""
    r = gguf.GGUFReader(str(src))
    a = arch or str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8")
    w = gguf.GGUFWriter(str(dst), a)
    kv = dict(kv or {})
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name in kv:
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.STRING:
            w.add_string(name, str(bytes(f.parts[-1]), "utf-8"))
        elif t == gguf.GGUFValueType.UINT32:
            w.add_uint32(name, int(f.parts[-1][0]))
        elif t == gguf.GGUFValueType.FLOAT32:
            w.add_float32(name, float(f.parts[-1][0]))
        elif t == gguf.GGUFValueType.BOOL:
            w.add_bool(name, bool(f.parts[-1][0]))
    for name, v in kv.items():
        if isinstance(v, str):
            w.add_string(name, v)
        elif isinstance(v, float):
            w.add_float32(name, v)
        else:
            w.add_uint32(name, int(v))
    for t in r.tensors:
        if t.name in drop_tensors:
            continue
        data = np.array(t.data)
        if tensor_fn is not None:
            data = tensor_fn(t.name, data)
        if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16) or data.dtype != np.uint8:
            w.add_tensor(t.name, data)
        else:
            w.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def fixture_generator(fixture_dir: Path, out_dir: Path, *, n_ctx: int, draft: Optional[str] = None):
    """(golden outputs, SpeculativeGenerator) on the fixture target with its converted F32
    drafter; flash attention off to match the HF reference's greedy continuation exactly."""
    from moa_cpp.convert import convert
    from moa_cpp.drafter.drafter import DrafterModel
    from moa_cpp.generator import SpeculativeGenerator
    from moa_cpp.target.target import Target

    tgt_path = fixture_dir / "target-f32.gguf"
    drafter = convert(fixture_dir / "drafter_hf", out_dir / "d.gguf", outtype="f32", target_gguf=tgt_path,
                      progress=False)
    target = Target.from_path(tgt_path, n_ctx=n_ctx, n_batch=128, flash_attn=False)
    gen = SpeculativeGenerator(target, DrafterModel(drafter, tgt_path), draft=draft)
    return dict(np.load(fixture_dir / "golden.npz")), gen


def drafting_default_generator(*, n_ctx: int, n_threads: int, **kw):
    """The default target with its shipped drafter, made to draft: the cost-aware default drafts
    only once the target's verify cost T(k) is measured; a flat T(k) (as on a GPU) makes every
    generation go through speculation, so comparisons with plain decoding test it."""
    from moa_cpp.models import defaults
    from moa_cpp.generator import SpeculativeGenerator

    g = SpeculativeGenerator.from_paths(defaults.default_target(), defaults.default_drafter(), n_ctx=n_ctx,
                                        n_threads=n_threads, **kw)
    g.loop.policy_for(g.draft).verify_cost = {k: 0.01 for k in range(1, 10)}
    return g
