"""Checkpoint layouts (Format A ``moa_spec`` / Format B training snapshot), name mapping and
derivation of every drafter size from tensor shapes (docs/drafter.md#sizes-from-shapes, #checkpoint-formats)."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moa_cpp.format.arch import TARGET_ARCHS
from moa_cpp.errors import FormatError
from moa_cpp.format.names import D2T, DRAFT_OUTPUT, MODULES, OPTIONAL_HF, tensor_map
from moa_cpp.convert.safetensors_io import TensorInfo, list_tensors

log = logging.getLogger(__name__)

# HF model_types of the training snapshots (Format B) the converter accepts: moa_cpp.format.arch's table.
SNAPSHOT_MODEL_TYPES = tuple(a.snapshot_model_type for a in TARGET_ARCHS if a.snapshot_model_type)
_STRIP_PREFIXES = ("model.",)          # tolerated leading prefix on HF names
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # non-persistent buffer; harmless if present


@dataclass(frozen=True)
class Layout:
    """A recognised checkpoint: its format, config and the 29 tensors keyed by GGUF name."""

    source_format: str                  # "moa_spec" (Format A) | "snapshot" (Format B)
    config: dict[str, Any]
    tensors: dict[str, TensorInfo]      # GGUF name -> source tensor


@dataclass(frozen=True)
class Hparams:
    """Drafter hyper-parameters, every size derived from shapes; ``sources`` says where each came from."""

    d: int
    head_count: int
    key_length: int
    sa_kv: int
    sa_ffn: int
    ca_kv: int
    ca_ffn: int
    lsa_width: int
    lsa_head_count: int
    lsa_key_length: int
    lsa_kv: int
    lsa_ffn: int
    rms_eps: float
    rope_theta: float
    vocab_size: int
    embedding_scale: float | None       # config embedding_scale (SA input scale), if any
    config_block_count: int | None      # snapshot config num_hidden_layers (target L), if any
    config_arch: str | None             # snapshot model_type (target architecture), if any
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def target_kv(self) -> int:
        """Target KV heads: W = 2 * H_kv * D."""
        return self.lsa_width // (2 * self.key_length)


def _read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise FormatError(f"unknown layout: {folder} has no config.json (need a moa_spec config or "
                          f"a {'/'.join(SNAPSHOT_MODEL_TYPES)} training-snapshot config)")
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise FormatError(f"{path}: invalid JSON ({e})") from e


def _strip(name: str) -> str:
    for p in _STRIP_PREFIXES:
        if name.startswith(p):
            return name[len(p):]
    return name


def detect_layout(folder: Path) -> Layout:
    """Recognise the checkpoint in ``folder`` and map its tensors to GGUF names.

    Raises FormatError listing every problem: unknown layout, disable_LSA variant, missing or
    unexpected tensors.
    """
    config = _read_config(folder)
    mt = config.get("model_type")
    if mt == "moa_spec":
        fmt = "moa_spec"
    elif mt in SNAPSHOT_MODEL_TYPES:
        fmt = "snapshot"
    else:
        raise FormatError(f"unknown layout: config.json model_type {mt!r} (expected 'moa_spec', or a "
                          f"training snapshot with model_type in {list(SNAPSHOT_MODEL_TYPES)})")
    log.info("layout: %s (config model_type %r, architectures %s)", fmt, mt, config.get("architectures"))

    found = list_tensors(folder)
    hf_to_gguf = {hf: g for g, hf in tensor_map().items()}
    mapped: dict[str, TensorInfo] = {}
    extra: list[str] = []
    problems: list[str] = []
    for raw, info in sorted(found.items()):
        name = _strip(raw)
        if name.endswith(_IGNORED_SUFFIXES):
            log.info("ignoring buffer %s", raw)
            continue
        g = hf_to_gguf.get(name) or OPTIONAL_HF.get(name)
        if g is None:
            extra.append(raw)
        elif g in mapped:
            problems.append(f"tensor {name!r} present twice ({mapped[g].name!r} and {raw!r})")
        else:
            mapped[g] = info

    has_lsa = any(g.startswith(("lsa.", "ekv2e.")) for g in mapped)
    has_sa_ca = any(g.startswith(("sa.", "ca.")) for g in mapped)
    if config.get("disable_LSA") or (has_sa_ca and not has_lsa):
        raise FormatError(f"disable_LSA checkpoint ({len(found)} tensors, no layer_self_attention.* / "
                          "Ekv2E.* tensors): this variant is not supported")
    missing = [f"{hf} (-> {g})" for g, hf in tensor_map().items() if g not in mapped]
    if (DRAFT_OUTPUT in mapped) != (D2T in mapped):
        problems.append("a reduced draft vocabulary needs both 'draft_lm_head.weight' and 'd2t'")
    if missing:
        problems.append("missing tensors: " + ", ".join(missing))
    if extra:
        hint = (" (attention/MLP biases, e.g. from a Qwen2 target, are not supported)"
                if any(n.endswith(".bias") for n in extra) else "")
        shown = ", ".join(extra[:20]) + (f", ... ({len(extra) - 20} more)" if len(extra) > 20 else "")
        problems.append(f"unexpected extra tensors: {shown}{hint}")
    if problems:
        raise FormatError(f"{folder}: invalid MoA checkpoint:\n  - " + "\n  - ".join(problems))
    return Layout(fmt, config, mapped)


def _div(a: int, b: int, what: str, problems: list[str]) -> int:
    if b <= 0 or a % b:
        problems.append(f"{what}: {a} is not a multiple of {b}")
        return 0
    return a // b


class _Derivation:
    """The state the steps of :func:`derive_hparams` share: config, tensors, target fallback, the
    problems found so far (all reported at once) and where each value came from."""

    def __init__(self, layout: Layout, fallback: dict[str, Any] | None) -> None:
        self.cfg, self.t, self.fb = layout.config, layout.tensors, fallback or {}
        self.problems: list[str] = []
        self.src: dict[str, str] = {}

    def shape(self, g: str) -> tuple[int, ...]:
        return self.t[g].shape

    def from_config(self, key: str, fb_key: str, what: str) -> Any:
        if self.cfg.get(key) is not None:
            self.src[what] = f"config.json {key}"
            return self.cfg[key]
        if self.fb.get(fb_key) is not None:
            self.src[what] = "target GGUF"
            return self.fb[fb_key]
        self.problems.append(f"{what}: not in config.json ({key}) and no target GGUF to take it from")
        return None

    def positive_int(self, key: str) -> int | None:
        """An optional positive-integer config key (None when absent or invalid)."""
        v = self.cfg.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            self.problems.append(f"config.json {key} = {v!r}: must be a positive integer")
            return None
        return v

    def raise_problems(self) -> None:
        if self.problems:
            raise FormatError("invalid MoA checkpoint:\n  - " + "\n  - ".join(self.problems))


def _check_ranks(dv: _Derivation) -> None:
    """RoPE scaling and tensor ranks, fatal at once: the arithmetic after this indexes shapes."""
    cfg = dv.cfg
    if cfg.get("rope_scaling") is not None:
        dv.problems.append(f"config.json rope_scaling {cfg['rope_scaling']!r}: RoPE scaling is not supported yet")
    for g in dv.t:
        want = 1 if g.endswith(("_norm.weight", ".bias")) or g == D2T else 2
        if len(dv.shape(g)) != want:
            dv.problems.append(f"{dv.t[g].name}: rank {len(dv.shape(g))}, expected {want}")
    dv.raise_problems()


def _sa_head_dim(dv: _Derivation, H: int) -> int:
    """SA/CA head dim D: config ``head_dim`` when given (checked against q_proj), else q_out / H."""
    cfg, src, problems = dv.cfg, dv.src, dv.problems
    q_out = dv.shape("sa.attn_q.weight")[0]
    cfg_hd = dv.positive_int("head_dim")
    if cfg_hd is not None:
        # Targets whose head dim is not d/H (Gemma-3: 256 vs 640/4, docs/drafter.md#other-targets) size SA/CA by it.
        D = cfg_hd
        src["key_length"] = "config.json head_dim"
        if q_out != H * D:
            problems.append(f"config.json head_dim = {D} but sa.q_proj.out {q_out} != "
                            f"num_attention_heads {H} * head_dim")
            D = 0
    elif "head_dim" in cfg and cfg["head_dim"] is not None:
        D = 0  # invalid value, already reported
    else:
        D = _div(q_out, H, "key_length = sa.q_proj.out / head_count", problems) if H else 0
        src["key_length"] = "sa.q_proj.out / head_count"
    return D


def _lsa_heads(dv: _Derivation, H: int, W: int) -> tuple[int, int]:
    """LSA query heads and head dim (H_l, D_l)."""
    src = dv.src
    # The reference LSA uses the target's H query heads; other targets may need another count
    # because W / H must be an even integer (SmolLM2-135M: W = 384, H = 9; docs/drafter.md#other-targets).
    H_l = H
    src["lsa_head_count"] = "= head_count (reference: LSA uses the target's query heads)"
    if dv.cfg.get("layer_self_attention_num_attention_heads") is not None:
        H_l = dv.positive_int("layer_self_attention_num_attention_heads") or 0
        src["lsa_head_count"] = "config.json layer_self_attention_num_attention_heads"
    src["lsa_key_length"] = "lsa_width / lsa_head_count"
    D_l = _div(W, H_l, "lsa key_length = W / lsa_head_count", dv.problems) if H_l else 0
    return H_l, D_l


def _config_embedding_scale(dv: _Derivation) -> Any:
    """config ``embedding_scale`` (SA input scale) if present and valid, else None."""
    scale = dv.cfg.get("embedding_scale")
    if scale is not None:
        dv.src["embedding_scale"] = "config.json embedding_scale"
        if isinstance(scale, bool) or not (isinstance(scale, (int, float)) and 0 < float(scale) < float("inf")):
            dv.problems.append(f"config.json embedding_scale = {scale!r}: must be a positive finite number")
            scale = None
    return scale


def _kv_heads_and_ffn(dv: _Derivation, D: int, D_l: int) -> tuple[int, int, int, dict[str, int]]:
    """KV heads of SA / CA / LSA (k_proj.out / head dim) and each module's FFN width."""
    problems, shape = dv.problems, dv.shape
    sa_kv = _div(shape("sa.attn_k.weight")[0], D, "sa kv heads = sa.k_proj.out / key_length", problems) if D else 0
    ca_kv = _div(shape("ca.attn_k.weight")[0], D, "ca kv heads = ca.k_proj.out / key_length", problems) if D else 0
    lsa_kv = _div(shape("lsa.attn_k.weight")[0], D_l, "lsa kv heads = lsa.k_proj.out / lsa key_length",
                  problems) if D_l else 0
    ffn = {m: shape(f"{m}.ffn_up.weight")[0] for m in MODULES}
    for what in ("sa_kv", "ca_kv", "lsa_kv"):
        dv.src[what] = f"{what[:-3]}.k_proj.out / head dim"
    for m in MODULES:
        dv.src[f"{m}_ffn"] = f"{m}.up_proj.out"
    return sa_kv, ca_kv, lsa_kv, ffn


def _check_module_shapes(dv: _Derivation, d: int, W: int, heads: dict[str, tuple[int, int, int]],
                         ffn: dict[str, int]) -> None:
    """Every SA / CA / LSA / Ekv2E shape against the derived sizes; heads: module -> (H, D, kv)."""
    widths = {"sa": d, "ca": d, "lsa": W}
    for m, (n_head, hd, kv) in heads.items():
        width, f = widths[m], ffn[m]
        expect = {
            "attn_norm.weight": (width,), "ffn_norm.weight": (width,),
            "attn_q.weight": (n_head * hd, width), "attn_k.weight": (kv * hd, width),
            "attn_v.weight": (kv * hd, width), "attn_output.weight": (width, n_head * hd),
            "ffn_gate.weight": (f, width), "ffn_up.weight": (f, width), "ffn_down.weight": (width, f),
        }
        for suffix, want in expect.items():
            g = f"{m}.{suffix}"
            if dv.shape(g) != want:
                dv.problems.append(f"{dv.t[g].name}: shape {list(dv.shape(g))}, expected {list(want)}")
        if kv and n_head % kv:
            dv.problems.append(f"{m}: {n_head} query heads not a multiple of {kv} kv heads")
    for g, want in (("ekv2e.weight", (d, W)), ("ekv2e.bias", (d,))):
        if dv.shape(g) != want:
            dv.problems.append(f"{dv.t[g].name}: shape {list(dv.shape(g))}, expected {list(want)}")


def _check_config_values(dv: _Derivation, source_format: str, checks: dict[str, int], W: int, D: int,
                         kv_ffn: tuple[int, int, int, dict[str, int]]) -> None:
    """Config values are cross-checks only: shapes decide."""
    sa_kv, ca_kv, lsa_kv, ffn = kv_ffn
    if source_format == "moa_spec":
        checks.update({"self_attention_num_key_value_heads": sa_kv, "self_attention_intermediate_size": ffn["sa"],
                       "cross_attention_num_key_value_heads": ca_kv, "cross_attention_intermediate_size": ffn["ca"],
                       "kv_hidden_size": W, "layer_self_attention_num_key_value_heads": lsa_kv,
                       "layer_self_attention_intermediate_size": ffn["lsa"]})
    elif D:
        checks["num_key_value_heads"] = W // (2 * D)  # snapshot config is the target's
    for key, val in checks.items():
        if dv.cfg.get(key) is not None and val and int(dv.cfg[key]) != val:
            dv.problems.append(f"config.json {key} = {dv.cfg[key]} but the tensor shapes give {val}")


def derive_hparams(layout: Layout, fallback: dict[str, Any] | None = None) -> Hparams:
    """Derive every size from tensor shapes (docs/drafter.md#sizes-from-shapes) and check all 29 shapes and the config.

    ``fallback`` (from the target GGUF) supplies head_count / rms_eps / rope_theta / vocab_size
    only when the config lacks them. Raises FormatError listing every problem.
    """
    dv = _Derivation(layout, fallback)
    cfg, src, problems = dv.cfg, dv.src, dv.problems
    _check_ranks(dv)

    H = int(dv.from_config("num_attention_heads", "head_count", "head_count") or 0)
    eps = dv.from_config("rms_norm_eps", "rms_eps", "rms_eps")
    theta = dv.from_config("rope_theta", "rope_theta", "rope_theta")
    vocab = dv.from_config("vocab_size", "vocab_size", "vocab_size")
    d = dv.shape("sa.attn_q.weight")[1]
    src["d"] = "sa.attn_q.weight in-features"
    D = _sa_head_dim(dv, H)
    if H and D and H * D != d:
        log.info("SA/CA head dim %d != d / H = %d / %d (non-reference target, docs/drafter.md#other-targets)", D, d, H)
    W = dv.shape("lsa.attn_q.weight")[0]
    src["lsa_width"] = "lsa.q_proj.out"
    src["config_block_count"] = "snapshot config num_hidden_layers (target L)"
    src["config_arch"] = "snapshot config model_type"
    H_l, D_l = _lsa_heads(dv, H, W)
    scale = _config_embedding_scale(dv)
    if D_l % 2:
        problems.append(f"lsa key_length {D_l} is odd (RoPE needs an even head dim)")
    if D and W % (2 * D):
        problems.append(f"lsa width {W} is not 2 * target_kv_heads * key_length {D}")
    kv_ffn = _kv_heads_and_ffn(dv, D, D_l)
    sa_kv, ca_kv, lsa_kv, ffn = kv_ffn
    if H and D and D_l:
        _check_module_shapes(dv, d, W, {"sa": (H, D, sa_kv), "ca": (H, D, ca_kv), "lsa": (H_l, D_l, lsa_kv)}, ffn)
    _check_config_values(dv, layout.source_format, {"hidden_size": d, "head_dim": D}, W, D, kv_ffn)
    dv.raise_problems()

    snap = layout.source_format == "snapshot"
    hp = Hparams(d=d, head_count=H, key_length=D, sa_kv=sa_kv, sa_ffn=ffn["sa"], ca_kv=ca_kv,
                 ca_ffn=ffn["ca"], lsa_width=W, lsa_head_count=H_l, lsa_key_length=D_l, lsa_kv=lsa_kv,
                 lsa_ffn=ffn["lsa"], rms_eps=float(eps), rope_theta=float(theta), vocab_size=int(vocab),
                 embedding_scale=float(scale) if scale is not None else None,
                 config_block_count=cfg.get("num_hidden_layers") if snap else None,
                 config_arch=cfg.get("model_type") if snap else None, sources=src)
    src["target_kv"] = "lsa_width / (2 * key_length)"
    for k, v in hp.__dict__.items():
        if k != "sources":
            log.info("  %-18s = %-10s (%s)", k, v, src.get(k, "?") if v is not None else "absent")
    return hp
