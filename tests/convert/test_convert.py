"""Converter tests on the moa-ref-tiny fixture (no network anywhere)."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any, Callable

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from moa_cpp.convert import convert
from moa_cpp.errors import FormatError, InvalidArgumentError, MismatchError, MoaIOError
from moa_cpp.format.names import ARCH, Keys, tensor_map

FIXTURE = Path(os.environ.get("MOA_FIXTURE_DIR") or
               Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "moa-ref-tiny")
HF, SNAP, TARGET = FIXTURE / "drafter_hf", FIXTURE / "drafter_snapshot", FIXTURE / "target-f32.gguf"
REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not FIXTURE.is_dir(), reason=f"fixture not found: {FIXTURE}")

Q = gguf.GGMLQuantizationType


# ---------------------------------------------------------------- helpers

def read_gguf(path: Path) -> tuple[dict[str, Any], dict[str, gguf.ReaderTensor]]:
    """(metadata key -> value, tensor name -> tensor) of a GGUF file."""
    r = gguf.GGUFReader(path)
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    meta["__types__"] = {k: f.types[0] for k, f in r.fields.items()}
    return meta, {t.name: t for t in r.tensors}


def as_f32(t: gguf.ReaderTensor) -> np.ndarray:
    """A tensor's values in PyTorch shape (reader data is already numpy order = reversed ne)."""
    if t.tensor_type in (Q.F32, Q.F16):
        return np.asarray(t.data, dtype=np.float32)
    return gguf.quants.dequantize(t.data, t.tensor_type)


def source_tensors(folder: Path) -> dict[str, np.ndarray]:
    """GGUF name -> fixture safetensors value."""
    st = load_file(str(folder / "model.safetensors"))
    return {g: st[hf] for g, hf in tensor_map().items()}


def copy_ckpt(tmp_path: Path, src: Path = HF, name: str = "ckpt",
              tensors: Callable[[dict[str, np.ndarray]], None] | None = None,
              config: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """A modified copy of a fixture checkpoint: ``tensors`` / ``config`` mutate in place."""
    dst = tmp_path / name
    dst.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    if config:
        config(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    st = load_file(str(src / "model.safetensors"))
    if tensors:
        tensors(st)
    save_file(st, str(dst / "model.safetensors"))
    return dst


def save_bf16(tensors: dict[str, np.ndarray], path: Path) -> None:
    """Write a BF16 safetensors file by hand (safetensors.numpy has no bfloat16)."""
    header: dict[str, Any] = {}
    blobs, off = [], 0
    for name, x in tensors.items():
        bits = (np.ascontiguousarray(x, dtype=np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(x.shape), "data_offsets": [off, off + len(bits)]}
        blobs.append(bits)
        off += len(bits)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


@pytest.fixture(scope="module")
def f32_outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both fixture layouts converted to F32 against the fixture target."""
    d = tmp_path_factory.mktemp("f32")
    return {name: convert(src, d / f"{name}.gguf", outtype="f32", target_gguf=TARGET, progress=False)
            for name, src in (("hf", HF), ("snapshot", SNAP))}


# ---------------------------------------------------------------- conversion

@pytest.mark.parametrize("layout", ["hf", "snapshot"])
def test_f32_bit_exact(f32_outputs: dict[str, Path], layout: str) -> None:
    _, tensors = read_gguf(f32_outputs[layout])
    src = source_tensors(HF if layout == "hf" else SNAP)
    assert set(tensors) == set(src) and len(tensors) == 29
    for g, x in src.items():
        t = tensors[g]
        assert t.tensor_type == Q.F32, g
        assert list(t.shape) == list(reversed(x.shape)), g  # ggml ne = reversed PyTorch shape
        got = as_f32(t)
        assert got.shape == x.shape and np.array_equal(got.view(np.uint32), x.view(np.uint32)), g


def test_layouts_give_identical_tensors(f32_outputs: dict[str, Path]) -> None:
    _, a = read_gguf(f32_outputs["hf"])
    _, b = read_gguf(f32_outputs["snapshot"])
    for g in a:
        assert a[g].tensor_type == b[g].tensor_type and list(a[g].shape) == list(b[g].shape)
        assert np.array_equal(np.asarray(a[g].data), np.asarray(b[g].data)), g


@pytest.mark.parametrize("layout", ["hf", "snapshot"])
def test_metadata(f32_outputs: dict[str, Path], layout: str) -> None:
    meta, _ = read_gguf(f32_outputs[layout])
    types = meta["__types__"]
    assert meta["general.architecture"] == ARCH
    assert meta["general.file_type"] == gguf.LlamaFileType.ALL_F32
    assert meta["general.name"] == ("drafter_hf" if layout == "hf" else "drafter_snapshot")
    want_u32 = {
        Keys.FORMAT_VERSION: 1, Keys.EMBEDDING_LENGTH: 64, Keys.HEAD_COUNT: 4, Keys.KEY_LENGTH: 16,
        Keys.VOCAB_SIZE: 49152, Keys.TLI: 0, Keys.TARGET_BLOCK_COUNT: 4, Keys.TARGET_HEAD_COUNT_KV: 2,
        Keys.TARGET_KEY_LENGTH: 16, Keys.SA_HEAD_COUNT_KV: 2, Keys.SA_FFN: 96, Keys.CA_HEAD_COUNT_KV: 2,
        Keys.CA_FFN: 80, Keys.LSA_WIDTH: 64, Keys.LSA_HEAD_COUNT: 4, Keys.LSA_HEAD_COUNT_KV: 2,
        Keys.LSA_KEY_LENGTH: 16, Keys.LSA_FFN: 48,
    }
    for k, v in want_u32.items():
        assert meta[k] == v and types[k] == gguf.GGUFValueType.UINT32, k
    want_f32 = {Keys.RMS_EPS: 1e-5, Keys.ROPE_FREQ_BASE: 100000.0, Keys.EMBEDDING_SCALE: 1.0}
    for k, v in want_f32.items():
        assert np.float32(meta[k]) == np.float32(v) and types[k] == gguf.GGUFValueType.FLOAT32, k
    want_str = {Keys.ROPE_QK_LAYOUT: "neox", Keys.LSA_INPUT_LAYOUT: "hf", Keys.SA_ROPE_SCALING: "none",
                Keys.TARGET_ARCH: "llama",
                Keys.SOURCE_FORMAT: "moa_spec" if layout == "hf" else "snapshot"}
    for k, v in want_str.items():
        assert meta[k] == v and types[k] == gguf.GGUFValueType.STRING, k
    # Nothing optional that this converter never produces.
    assert Keys.DRAFT_VOCAB_SIZE not in meta and Keys.TARGET_BUNDLED not in meta


@pytest.mark.parametrize("outtype,qtype,rel_tol", [("f16", Q.F16, 1e-3), ("q8_0", Q.Q8_0, 1e-2),
                                                   ("q4_0", Q.Q4_0, 0.15)])
def test_narrow_outtypes(tmp_path: Path, outtype: str, qtype: Q, rel_tol: float) -> None:
    out = convert(HF, tmp_path / "o.gguf", outtype=outtype, progress=False)
    meta, tensors = read_gguf(out)
    assert meta["general.file_type"] == {"f16": 1, "q8_0": 7, "q4_0": 2}[outtype]
    for g, x in source_tensors(HF).items():
        t = tensors[g]
        if x.ndim == 1:
            want = Q.F32  # norms and Ekv2E bias stay exact
        elif x.shape[-1] % 32 and outtype != "f16":
            want = Q.F16  # ca/lsa ffn_down rows (80, 48) are not whole Q blocks
        else:
            want = qtype
        assert t.tensor_type == want, g
        assert list(t.shape) == list(reversed(x.shape)), g
        got = as_f32(t)
        assert got.shape == x.shape, g
        tol = 0.0 if want == Q.F32 else (1e-3 if want == Q.F16 else rel_tol) * float(np.abs(x).max())
        assert float(np.abs(got - x).max()) <= tol, g


def test_target_block_count_sources(tmp_path: Path) -> None:
    cases = [(HF, None, 0), (HF, 4, 4), (SNAP, None, 4), (SNAP, 4, 4)]
    for i, (src, layers, want) in enumerate(cases):
        meta, _ = read_gguf(convert(src, tmp_path / f"{i}.gguf", outtype="f32",
                                    target_block_count=layers, progress=False))
        assert meta[Keys.TARGET_BLOCK_COUNT] == want
    with pytest.raises(MismatchError, match="--target-layers 5"):
        convert(HF, tmp_path / "x.gguf", target_gguf=TARGET, target_block_count=5, progress=False)
    with pytest.raises(MismatchError, match="num_hidden_layers 4"):
        convert(SNAP, tmp_path / "x.gguf", target_block_count=6, progress=False)


def test_tli(tmp_path: Path) -> None:
    meta, _ = read_gguf(convert(HF, tmp_path / "t.gguf", target_gguf=TARGET, tli=1, progress=False))
    assert meta[Keys.TLI] == 1
    with pytest.raises(InvalidArgumentError, match="tli 4"):
        convert(HF, tmp_path / "x.gguf", target_gguf=TARGET, tli=4, progress=False)
    with pytest.raises(InvalidArgumentError):
        convert(HF, tmp_path / "x.gguf", tli=-1, progress=False)


def test_f16_and_bf16_inputs(tmp_path: Path) -> None:
    src = load_file(str(HF / "model.safetensors"))
    for name, write in (("f16", lambda d: save_file({k: v.astype(np.float16) for k, v in src.items()},
                                                    str(d / "model.safetensors"))),
                        ("bf16", lambda d: save_bf16(src, d / "model.safetensors"))):
        d = tmp_path / name
        d.mkdir()
        shutil.copy(HF / "config.json", d / "config.json")
        write(d)
        _, tensors = read_gguf(convert(d, tmp_path / f"{name}.gguf", outtype="f32", progress=False))
        for g, hf in tensor_map().items():
            x = src[hf]
            want = (x.astype(np.float16).astype(np.float32) if name == "f16"
                    else (x.view(np.uint32) & 0xFFFF0000).view(np.float32))  # bf16 = truncated f32
            assert np.array_equal(as_f32(tensors[g]), want), (name, g)


def test_model_prefix_and_sharded_index(tmp_path: Path, f32_outputs: dict[str, Path]) -> None:
    st = load_file(str(HF / "model.safetensors"))
    d = tmp_path / "sharded"
    d.mkdir()
    shutil.copy(HF / "config.json", d / "config.json")
    names = sorted(st)
    weight_map = {}
    for i, part in enumerate((names[:15], names[15:])):
        fname = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({"model." + n: st[n] for n in part}, str(d / fname))
        weight_map.update({"model." + n: fname for n in part})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    _, got = read_gguf(convert(d, tmp_path / "s.gguf", outtype="f32", target_gguf=TARGET, progress=False))
    _, ref = read_gguf(f32_outputs["hf"])
    assert all(np.array_equal(np.asarray(got[g].data), np.asarray(ref[g].data)) for g in ref)


def test_f16_overflow_keeps_f32(tmp_path: Path) -> None:
    def big(st: dict[str, np.ndarray]) -> None:
        st["self_attention.mlp.up_proj.weight"] = st["self_attention.mlp.up_proj.weight"].copy()
        st["self_attention.mlp.up_proj.weight"][0, 0] = 1e6
    d = copy_ckpt(tmp_path, tensors=big)
    _, tensors = read_gguf(convert(d, tmp_path / "o.gguf", outtype="f16", progress=False))
    assert tensors["sa.ffn_up.weight"].tensor_type == Q.F32
    assert as_f32(tensors["sa.ffn_up.weight"])[0, 0] == 1e6
    assert tensors["sa.ffn_gate.weight"].tensor_type == Q.F16


def test_cli_script(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("convert_script", REPO / "convert" / "convert_moa_to_gguf.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    out = tmp_path / "cli.gguf"
    assert mod.main([str(SNAP), "-o", str(out), "--outtype", "q8_0", "--target-gguf", str(TARGET),
                     "--no-progress"]) == 0
    assert out.is_file()
    assert mod.main([str(tmp_path / "nope"), "-o", str(tmp_path / "n.gguf")]) == 2


# ---------------------------------------------------------------- errors

def test_missing_tensor(tmp_path: Path) -> None:
    def drop(st: dict[str, np.ndarray]) -> None:
        del st["cross_attention.mlp.up_proj.weight"], st["Ekv2E.bias"]
    d = copy_ckpt(tmp_path, tensors=drop)
    with pytest.raises(FormatError, match="missing tensors") as e:
        convert(d, tmp_path / "o.gguf", progress=False)
    assert "cross_attention.mlp.up_proj.weight" in str(e.value) and "Ekv2E.bias" in str(e.value)
    assert not (tmp_path / "o.gguf").exists()


def test_extra_tensor(tmp_path: Path) -> None:
    def add(st: dict[str, np.ndarray]) -> None:
        st["self_attention.self_attn.q_proj.bias"] = np.zeros(64, np.float32)
    d = copy_ckpt(tmp_path, tensors=add)
    with pytest.raises(FormatError, match="unexpected extra tensors: self_attention.self_attn.q_proj.bias"):
        convert(d, tmp_path / "o.gguf", progress=False)


def test_wrong_shape(tmp_path: Path) -> None:
    def bad(st: dict[str, np.ndarray]) -> None:
        st["cross_attention.mlp.down_proj.weight"] = np.zeros((64, 81), np.float32)
        st["layer_self_attention.input_layernorm.weight"] = np.ones(63, np.float32)
    d = copy_ckpt(tmp_path, tensors=bad)
    with pytest.raises(FormatError) as e:
        convert(d, tmp_path / "o.gguf", progress=False)
    msg = str(e.value)  # one error lists every problem
    assert "cross_attention.mlp.down_proj.weight: shape [64, 81], expected [64, 80]" in msg
    assert "layer_self_attention.input_layernorm.weight: shape [63], expected [64]" in msg


def test_config_shape_disagreement(tmp_path: Path) -> None:
    d = copy_ckpt(tmp_path, config=lambda c: c.update(self_attention_intermediate_size=128))
    with pytest.raises(FormatError, match="self_attention_intermediate_size = 128 but the tensor shapes give 96"):
        convert(d, tmp_path / "o.gguf", progress=False)


@pytest.mark.parametrize("case", ["no_config", "foreign_model_type"])
def test_unknown_layout(tmp_path: Path, case: str) -> None:
    d = copy_ckpt(tmp_path, config=lambda c: c.update(model_type="gpt2"))
    if case == "no_config":
        (d / "config.json").unlink()
    with pytest.raises(FormatError, match="unknown layout"):
        convert(d, tmp_path / "o.gguf", progress=False)


def test_disable_lsa_rejected(tmp_path: Path) -> None:
    def strip(st: dict[str, np.ndarray]) -> None:
        for k in [k for k in st if k.startswith(("layer_self_attention.", "Ekv2E."))]:
            del st[k]
    d = copy_ckpt(tmp_path, tensors=strip, config=lambda c: c.update(disable_LSA=True))
    with pytest.raises(FormatError, match="disable_LSA"):
        convert(d, tmp_path / "o.gguf", progress=False)
    d2 = copy_ckpt(tmp_path, name="no_flag", tensors=strip)  # detected from the 18 tensors alone
    with pytest.raises(FormatError, match="disable_LSA checkpoint \\(18 tensors"):
        convert(d2, tmp_path / "o.gguf", progress=False)


def test_rope_scaling_rejected(tmp_path: Path) -> None:
    d = copy_ckpt(tmp_path, config=lambda c: c.update(rope_scaling={"type": "linear", "factor": 2.0}))
    with pytest.raises(FormatError, match="rope_scaling.*not supported"):
        convert(d, tmp_path / "o.gguf", progress=False)


def test_target_mismatch(tmp_path: Path) -> None:
    d = copy_ckpt(tmp_path, config=lambda c: c.update(vocab_size=32000, rope_theta=500000.0, rms_norm_eps=1e-6))
    with pytest.raises(MismatchError) as e:
        convert(d, tmp_path / "o.gguf", target_gguf=TARGET, progress=False)
    msg = str(e.value)
    assert "vocab_size: drafter 32000, target 49152" in msg
    assert "rope theta" in msg and "rms eps" in msg
    # H = 2 gives D = 32 (and 1 kv head per module): head count and head dim disagree with the target.
    def two_heads(c: dict[str, Any]) -> None:
        c.update(num_attention_heads=2, head_dim=None)
        for k in [k for k in c if k.endswith("num_key_value_heads")]:
            del c[k]
    d2 = copy_ckpt(tmp_path, name="heads", config=two_heads)
    with pytest.raises(MismatchError, match="attention.head_count H: drafter 2, target 4"):
        convert(d2, tmp_path / "o.gguf", target_gguf=TARGET, progress=False)


def test_missing_source(tmp_path: Path) -> None:
    with pytest.raises(MoaIOError):
        convert(tmp_path / "does-not-exist", tmp_path / "o.gguf", progress=False)


# ---------------------------------------------------------------- hub (offline)

def test_hub_repo_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--org--name"
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for f in ("config.json", "model.safetensors"):
        shutil.copy(SNAP / f, snap / f)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)  # "org/name" must not resolve as a local path
    out = convert("org/name", tmp_path / "hub.gguf", outtype="f32", progress=False)
    meta, tensors = read_gguf(out)
    assert meta["general.name"] == "org/name" and meta[Keys.SOURCE_FORMAT] == "snapshot"
    src = source_tensors(SNAP)
    assert all(np.array_equal(as_f32(tensors[g]), x) for g, x in src.items())
    with pytest.raises(MoaIOError, match="org/other"):
        convert("org/other", tmp_path / "x.gguf", progress=False)


# ---------------------------------------------------------------- non-reference targets (docs/drafter.md#other-targets)

def _spec(**kw: Any) -> "DrafterSpec":
    """A fixture-sized drafter spec (d 64, H 4, D 16, 2 KV heads, 4 layers) with overrides."""
    from moa_cpp.format.drafter_spec import DrafterSpec
    base = dict(d=64, n_head=4, head_dim=16, target_kv=2, target_layers=4, rms_eps=1e-5, rope_theta=100000.0,
                vocab_size=49152, embedding_scale=1.0, sa_kv=2, sa_ffn=96, ca_kv=2, ca_ffn=96, lsa_heads=4,
                lsa_kv=2, lsa_ffn=64)
    return DrafterSpec(**(base | kw))


def _edit_config(ckpt: Path, **kw: Any) -> Path:
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.update(kw)
    (ckpt / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    return ckpt


def test_lsa_head_count_key(tmp_path: Path) -> None:
    from moa_cpp.testing.random_drafter import write_checkpoint
    ckpt = write_checkpoint(_spec(lsa_heads=2, lsa_kv=1), tmp_path / "c")   # LSA 2 x 32, 1 KV head
    meta, _ = read_gguf(convert(ckpt, tmp_path / "o.gguf", target_gguf=TARGET, progress=False))
    assert (meta[Keys.LSA_HEAD_COUNT], meta[Keys.LSA_KEY_LENGTH], meta[Keys.LSA_HEAD_COUNT_KV]) == (2, 32, 1)
    assert meta[Keys.HEAD_COUNT] == 4 and meta[Keys.LSA_WIDTH] == 64
    # Head counts cannot be derived from shapes (docs/drafter.md#sizes-from-shapes): without the key the same tensors
    # read as the reference 4 heads x 16 with 2 KV heads. The config key is what decides.
    _edit_config(ckpt, layer_self_attention_num_attention_heads=None)
    meta, _ = read_gguf(convert(ckpt, tmp_path / "h.gguf", progress=False))
    assert (meta[Keys.LSA_HEAD_COUNT], meta[Keys.LSA_KEY_LENGTH], meta[Keys.LSA_HEAD_COUNT_KV]) == (4, 16, 2)
    for heads, match in ((3, "W / lsa_head_count"), (64, "lsa key_length 1 is odd"), (0, "must be a positive integer"),
                         ("2", "must be a positive integer")):
        _edit_config(ckpt, layer_self_attention_num_attention_heads=heads)
        with pytest.raises(FormatError, match=match):
            convert(ckpt, tmp_path / "x.gguf", progress=False)
    assert not (tmp_path / "x.gguf").exists()


def test_head_dim_not_d_over_h(tmp_path: Path) -> None:
    """Gemma-like: head_dim 32 with d / H = 16, so q_proj is [128, 64] and W = 2 * 1 * 32."""
    from moa_cpp.testing.random_drafter import write_checkpoint
    ckpt = write_checkpoint(_spec(head_dim=32, target_kv=1, sa_kv=1, ca_kv=1, lsa_kv=1), tmp_path / "c")
    meta, tensors = read_gguf(convert(ckpt, tmp_path / "o.gguf", outtype="f32", progress=False))
    assert meta[Keys.EMBEDDING_LENGTH] == 64 and meta[Keys.HEAD_COUNT] == 4
    assert meta[Keys.KEY_LENGTH] == 32 and meta[Keys.TARGET_KEY_LENGTH] == 32
    assert meta[Keys.TARGET_HEAD_COUNT_KV] == 1 and meta[Keys.LSA_WIDTH] == 64 and meta[Keys.LSA_KEY_LENGTH] == 16
    assert list(tensors["sa.attn_q.weight"].shape) == [64, 128] and list(tensors["ca.attn_output.weight"].shape) == [128, 64]
    _edit_config(ckpt, head_dim=None)          # shapes alone give the same D = q_proj.out / H
    meta2, _ = read_gguf(convert(ckpt, tmp_path / "o2.gguf", outtype="f32", progress=False))
    assert meta2[Keys.KEY_LENGTH] == 32
    _edit_config(ckpt, head_dim=16)
    with pytest.raises(FormatError, match="head_dim = 16 but sa.q_proj.out 128 != num_attention_heads 4"):
        convert(ckpt, tmp_path / "x.gguf", progress=False)
    _edit_config(ckpt, head_dim=32.5)
    with pytest.raises(FormatError, match="head_dim = 32.5: must be a positive integer"):
        convert(ckpt, tmp_path / "x.gguf", progress=False)
    _edit_config(ckpt, head_dim=32)
    with pytest.raises(MismatchError, match="key_length D: drafter 32, target 16"):
        convert(ckpt, tmp_path / "x.gguf", target_gguf=TARGET, progress=False)


def test_embedding_scale_key(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from moa_cpp.testing.random_drafter import write_checkpoint
    ckpt = write_checkpoint(_spec(embedding_scale=8.0), tmp_path / "c")
    meta, _ = read_gguf(convert(ckpt, tmp_path / "o.gguf", progress=False))
    assert meta[Keys.EMBEDDING_SCALE] == 8.0
    with caplog.at_level("WARNING"):           # differs from the llama target's 1.0: kept, with a warning
        meta, _ = read_gguf(convert(ckpt, tmp_path / "o.gguf", target_gguf=TARGET, progress=False))
    assert meta[Keys.EMBEDDING_SCALE] == 8.0 and "embedding_scale 8 differs" in caplog.text
    _edit_config(ckpt, embedding_scale=None)   # absent: the llama target's 1.0
    meta, _ = read_gguf(convert(ckpt, tmp_path / "o.gguf", target_gguf=TARGET, progress=False))
    assert meta[Keys.EMBEDDING_SCALE] == 1.0
    for bad in (-1.0, 0, "x", True):
        _edit_config(ckpt, embedding_scale=bad)
        with pytest.raises(FormatError, match="embedding_scale"):
            convert(ckpt, tmp_path / "x.gguf", progress=False)


# ---------------------------------------------------------------- reduced draft vocabulary

def _with_draft_vocab(ids: np.ndarray, rows: int | None = None, head: bool = True, d2t: bool = True):
    def add(st: dict[str, np.ndarray]) -> None:
        d = st["Ekv2E.weight"].shape[0]
        rng = np.random.default_rng(0)
        if head:
            st["draft_lm_head.weight"] = rng.standard_normal((rows or len(ids), d)).astype(np.float32)
        if d2t:
            st["d2t"] = ids
    return add


def test_reduced_vocab_written(tmp_path: Path) -> None:
    """A trainer snapshot's draft head + d2t become draft_output.weight [d, V] + I32 d2t + the size key,
    and the native loader maps draft ids back to target ids."""
    from moa_cpp.drafter.drafter import DrafterModel

    ids = np.array([3, 17, 42, 100, 2047, 5000], dtype=np.int64)
    d = copy_ckpt(tmp_path, tensors=_with_draft_vocab(ids))
    out = convert(d, tmp_path / "o.gguf", outtype="f32", target_gguf=TARGET, progress=False)
    meta, tensors = read_gguf(out)
    assert meta[Keys.DRAFT_VOCAB_SIZE] == len(ids)
    assert tensors["d2t"].tensor_type == Q.I32
    np.testing.assert_array_equal(np.asarray(tensors["d2t"].data), ids)
    head = load_file(str(d / "model.safetensors"))["draft_lm_head.weight"]
    np.testing.assert_array_equal(as_f32(tensors["draft_output.weight"]), head)
    m = DrafterModel(out, TARGET)
    try:
        assert m.n_vocab == len(ids)
        np.testing.assert_array_equal(m.d2t(), ids)
    finally:
        m.close()


@pytest.mark.parametrize("case,match", [
    ("head-only", "needs both 'draft_lm_head.weight' and 'd2t'"),
    ("d2t-only", "needs both 'draft_lm_head.weight' and 'd2t'"),
    ("rows", "one id per head row"),
    ("range", "outside the target vocabulary"),
    ("dup", "same target id"),
])
def test_reduced_vocab_rejected(tmp_path: Path, case: str, match: str) -> None:
    ids = np.array([3, 17, 42], dtype=np.int64)
    kw: dict[str, Any] = {"head-only": dict(d2t=False), "d2t-only": dict(head=False), "rows": dict(rows=5)}.get(case, {})
    if case == "range":
        ids = np.array([3, 17, 10**7], dtype=np.int64)
    if case == "dup":
        ids = np.array([3, 17, 17], dtype=np.int64)
    d = copy_ckpt(tmp_path, tensors=_with_draft_vocab(ids, **kw))
    with pytest.raises(FormatError, match=match):
        convert(d, tmp_path / "o.gguf", target_gguf=TARGET, progress=False)
    assert not (tmp_path / "o.gguf").exists()
