"""Tiny random checkpoints of many architectures, made with ``transformers`` and turned into GGUF
by llama.cpp's own converter: the outside reference of the per-architecture checks
(``tests/format/test_archs.py``, docs/architectures.md).

Each :data:`SPECS` row names a llama.cpp architecture (``general.architecture``) and the
``transformers`` config class (with its small sizes) whose ``*ForCausalLM`` llama.cpp's
``convert_hf_to_gguf.py`` maps to it. :func:`build` makes, once per content hash (sizes, seed,
transformers version, converter source), in ``<cache>/tiny-archs/<arch>-<hash>/``:

- ``hf/``: the random checkpoint (2 layers, F32, weights drawn with std ``INIT_STD``: at the
  default std a random model repeats one token, a larger one gives varied text) and a tokenizer;
- ``model.gguf``: the converter's F32 GGUF of it;
- ``meta.json``: what the converter did (whether it permuted the Q/K rows: NORM-rope layout).

The tokenizer is a 1,024-token byte-level BPE trained here on ShareGPT text, with a ChatML
template. The converter recognises a BPE tokenizer by hashing how it splits a test string; a
tokenizer trained here is on none of its lists, so the driver names its pre-tokenizer ``gpt-2``
(its regex is the one the BPE was trained with) and writes every vocabulary through the
converter's generic BPE path (``_set_vocab_gpt2``), also for architectures whose own path wants
a SentencePiece file. Weights and hyper-parameters go through the converter untouched.

The converter is the one in llama-cpp-python 0.3.36's sdist, extracted by
``scripts/llama_converter.sh`` (setup) into ``<cache>/llama-convert-0.3.36`` (or
``$MOA_LLAMA_CONVERTER``). It runs in a subprocess (``python -m moa_cpp.testing.tiny_archs``): its
``gguf-py`` is put first on that process's path.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from moa_cpp.models.registry import cache_dir

LLAMA_CPP_PYTHON = "0.3.36"
VOCAB = 1024
INIT_STD = 0.2
SEED = 1234
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

# the sizes every row starts from (config keys most llama-like configs share)
_BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, tie_word_embeddings=False,
             rms_norm_eps=1e-6)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)


@dataclass(frozen=True)
class TinySpec:
    """One architecture: llama.cpp's name, the transformers config class and its arguments."""

    arch: str                       # general.architecture of the converted GGUF
    config: str                     # transformers config class
    kwargs: dict = field(default_factory=dict)
    base: bool = True               # start from _BASE (False: kwargs are the whole config)
    note: str = ""                  # what this row exercises
    refused: bool = False           # an architecture moa_cpp refuses (the test checks the one-line refusal)
    gelu: bool = False              # GELU MLP: ggml's CPU GELU reads an fp16 table (ggml-cpu/vec.h
    #                                 GGML_GELU_FP16), ~1e-3 relative after the first MLP
    model_class: str = "AutoModelForCausalLM"   # the transformers class the converter knows the
    #                                 checkpoint by (a vision-language one for some text models)
    convert_args: tuple = ()        # converter options this checkpoint needs (as a user would pass them)

    def config_kwargs(self) -> dict[str, Any]:
        kw = dict(_BASE) if self.base else {}
        kw.update(self.kwargs)
        kw.update(vocab_size=VOCAB, initializer_range=INIT_STD)
        if "text_config" in kw:      # a multimodal config: the language model's sizes live there
            kw["text_config"] = dict(_BASE, **kw["text_config"], vocab_size=VOCAB, initializer_range=INIT_STD)
        return kw


SPECS: tuple[TinySpec, ...] = (
    TinySpec("llama", "LlamaConfig", note="NORM RoPE, Q/K rows permuted by the converter"),
    TinySpec("qwen2", "Qwen2Config", note="NEOX RoPE, QKV biases"),
    TinySpec("qwen3", "Qwen3Config", note="per-head Q/K RMS norms"),
    TinySpec("qwen3moe", "Qwen3MoeConfig", dict(_MOE, decoder_sparse_step=1, norm_topk_prob=True),
             note="MoE feed-forward (top-k weights normalised, as Qwen3 MoE models ship)"),
    TinySpec("qwen2moe", "Qwen2MoeConfig", dict(_MOE, shared_expert_intermediate_size=64), note="MoE + shared expert"),
    TinySpec("phi3", "Phi3Config", dict(pad_token_id=0), note="fused QKV projection"),
    TinySpec("gemma", "GemmaConfig", dict(hidden_activation="gelu_pytorch_tanh"), note="sqrt(n_embd) embedding scale", gelu=True),
    TinySpec("gemma2", "Gemma2Config", dict(query_pre_attn_scalar=16, sliding_window=8),
             note="sliding window on alternate layers, logit soft-capping", gelu=True),
    TinySpec("gemma3", "Gemma3TextConfig", dict(query_pre_attn_scalar=16, sliding_window=8),
             note="sliding window (llama.cpp's fixed 5:1 pattern), Q/K norms", gelu=True),
    TinySpec("gpt-oss", "GptOssConfig", dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=64,
                                             sliding_window=8, layer_types=["sliding_attention", "full_attention"],
                                             rope_scaling=None),
             note="attention sinks, sliding window, MoE; RoPE unscaled: training refuses scaled RoPE (YaRN) targets "
                  "(docs/architectures.md)"),
    TinySpec("olmo2", "Olmo2Config", note="Q/K norms over all heads, post-norms"),
    TinySpec("olmo", "OlmoConfig", note="non-parametric layer norm"),
    TinySpec("granite", "GraniteConfig", note="embedding / residual / attention multipliers"),
    TinySpec("granitemoe", "GraniteMoeConfig", dict(num_local_experts=4, num_experts_per_tok=2), note="MoE"),
    TinySpec("smollm3", "SmolLM3Config", dict(num_hidden_layers=4), note="every 4th layer without RoPE"),
    TinySpec("glm4", "Glm4Config", dict(partial_rotary_factor=0.5), note="partial rotary, post-norms"),
    TinySpec("stablelm", "StableLmConfig", dict(partial_rotary_factor=0.25), note="partial rotary, layer norm"),
    TinySpec("starcoder2", "Starcoder2Config", note="layer norm, biases", gelu=True),
    TinySpec("seed_oss", "SeedOssConfig", note="QKV biases"),
    TinySpec("command-r", "CohereConfig", dict(layer_norm_eps=1e-5, tie_word_embeddings=True),
             note="parallel block, interleaved RoPE"),
    TinySpec("arcee", "ArceeConfig", note="ReLU^2 MLP"),
    TinySpec("ernie4_5", "Ernie4_5Config", note="interleaved RoPE"),
    TinySpec("gpt2", "GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, n_positions=1024, n_ctx=1024),
             base=False, note="learned positions, no RoPE", gelu=True),
    TinySpec("gptneox", "GPTNeoXConfig", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                              num_attention_heads=4, rotary_pct=0.25), base=False,
             note="partial rotary, parallel residual", gelu=True),
    TinySpec("bloom", "BloomConfig", dict(hidden_size=64, n_layer=2, n_head=4), base=False, note="ALiBi, no RoPE", gelu=True),
    TinySpec("mistral3", "Mistral3Config",
             dict(text_config=dict(model_type="mistral", sliding_window=None),
                  vision_config=dict(model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, head_dim=16, image_size=32, patch_size=16),
                  spatial_merge_size=1), base=False, model_class="Mistral3ForConditionalGeneration",
             note="Mistral's current models (Mistral Small 3.x, Ministral): the text part of the vision-language "
                  "checkpoint"),
    TinySpec("lfm2", "Lfm2Config", dict(layer_types=["conv", "full_attention"], block_ff_dim=128,
                                        block_auto_adjust_ff_dim=False, conv_L_cache=3),
             note="hybrid: short convolutions + attention"),
    TinySpec("qwen3next", "Qwen3NextConfig",
             dict(_MOE, layer_types=["linear_attention", "full_attention"], full_attention_interval=2,
                  linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                  linear_conv_kernel_dim=4, shared_expert_intermediate_size=32, decoder_sparse_step=1),
             convert_args=("--no-mtp",),    # a transformers checkpoint has no MTP head to export
             note="hybrid without recurrent-state snapshots in llama.cpp: gated delta-net layers + gated "
                  "attention; captured and trained on, speculation refused"),
    TinySpec("mamba", "MambaConfig", dict(hidden_size=64, num_hidden_layers=2, state_size=8, expand=2, conv_kernel=4),
             base=False, refused=True, note="recurrent: refused, decodes plainly"),
)

BY_ARCH = {s.arch: s for s in SPECS}


def converter_dir() -> Path:
    """The extracted llama.cpp converter (``convert_hf_to_gguf.py``, ``conversion/``, ``gguf-py/``)."""
    env = os.environ.get("MOA_LLAMA_CONVERTER")
    return Path(env) if env else cache_dir() / f"llama-convert-{LLAMA_CPP_PYTHON}"


def converter_available() -> Optional[str]:
    """None if the converter is there, else why not (for a skip or an error message)."""
    d = converter_dir()
    if not (d / "convert_hf_to_gguf.py").is_file():
        return f"llama.cpp's converter not found in {d} (run: bash scripts/llama_converter.sh)"
    return None


def _source_hash() -> str:
    """Hash of what decides the files: this module, the converter's sources, transformers' version."""
    import transformers

    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(transformers.__version__.encode())
    d = converter_dir()
    for p in sorted([d / "convert_hf_to_gguf.py", *(d / "conversion").glob("*.py"), *(d / "gguf-py" / "gguf").glob("*.py")]):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def root() -> Path:
    return cache_dir() / "tiny-archs"


def paths(arch: str, key: str) -> dict[str, Path]:
    d = root() / f"{arch}-{key}"
    return {"dir": d, "hf": d / "hf", "gguf": d / "model.gguf", "meta": d / "meta.json"}


def build(archs: list[str], timeout: float = 900) -> dict[str, dict]:
    """The files of each architecture in ``archs`` (made once, by one converter process for all
    that are missing). Returns arch -> {"hf", "gguf", "meta" (dict)} or {"error": why}."""
    why = converter_available()
    if why:
        raise FileNotFoundError(why)
    key = _source_hash()
    root().mkdir(parents=True, exist_ok=True)
    # one builder at a time (parallel test workers): the converter process works in fixed
    # temporary folders, and a second one would remove the first one's
    with open(root() / ".build.lock", "w") as lock:
        try:
            import fcntl
            fcntl.flock(lock, fcntl.LOCK_EX)
        except ImportError:          # not POSIX: builds are not shared across processes there
            pass
        missing = [a for a in archs if not paths(a, key)["meta"].is_file()]
        if missing:
            cmd = [sys.executable, "-m", "moa_cpp.testing.tiny_archs", "--key", key, *missing]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            if r.returncode != 0:
                raise RuntimeError(f"tiny-arch build failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    out = {}
    for a in archs:
        p = paths(a, key)
        meta = json.loads(p["meta"].read_text())
        out[a] = meta if "error" in meta else {"hf": p["hf"], "gguf": p["gguf"], "meta": meta}
    return out


# ---------------------------------------------------------------- the converter process

def _texts(n: int = 1500) -> list[str]:
    from moa_cpp.train.sharegpt import iter_conversations

    out = []
    for conv in iter_conversations():
        out += [m["content"] for m in conv.messages if m.get("content")]
        if len(out) >= n:
            break
    return out


def _tokenizer(dst: Path):
    """The shared 1,024-token byte-level BPE with a ChatML template (trained once per root)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_texts(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|im_end|>",
                                   unk_token=None, pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    fast.save_pretrained(dst)
    return fast


def _make_checkpoint(spec: TinySpec, hf: Path, tok) -> None:
    import torch
    import transformers

    cfg = getattr(transformers, spec.config)(**spec.config_kwargs())
    for c in (cfg, cfg.get_text_config()):      # the same object for a text-only config
        c.bos_token_id = tok.bos_token_id
        c.eos_token_id = tok.eos_token_id
        c.pad_token_id = tok.pad_token_id
    torch.manual_seed(SEED)
    cls = getattr(transformers, spec.model_class)
    model = (cls.from_config(cfg, torch_dtype=torch.float32) if spec.model_class.startswith("Auto")
             else cls(cfg).to(torch.float32))
    # every matrix redrawn at INIT_STD (some models' _init_weights ignore initializer_range);
    # norms keep their init (1 or 0), biases get small values
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, INIT_STD)
            elif "bias" in name:
                p.normal_(0.0, 0.02)
    model.save_pretrained(hf, safe_serialization=True)
    tok.save_pretrained(hf)


def _convert(hf: Path, out: Path, extra: tuple = ()) -> dict:
    """Run the converter's own main() on hf; returns what it did (whether it permuted Q/K rows)."""
    import convert_hf_to_gguf as c
    import conversion.llama

    permuted: list[tuple] = []
    patched: list[tuple] = []
    real_get_class = c.get_model_class

    def watch_permute(owner) -> None:
        orig = owner.__dict__["permute"]
        fn = orig.__func__ if isinstance(orig, staticmethod) else orig

        def permute(weights, *args, **kwargs):
            permuted.append(tuple(weights.shape))
            return fn(weights, *args, **kwargs)

        patched.append((owner, orig))
        owner.permute = staticmethod(permute)

    def get_model_class(name, mmproj=False):
        cls = real_get_class(name, mmproj=mmproj)
        for owner in {conversion.llama.LlamaModel, *(k for k in cls.__mro__ if "permute" in k.__dict__)}:
            watch_permute(owner)

        class Tiny(cls):  # type: ignore[misc, valid-type]
            model_arch = cls.model_arch

            def set_vocab(self):
                self._set_vocab_gpt2()

            def get_vocab_base_pre(self, tokenizer) -> str:
                return "gpt-2"

            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                impl = getattr(self, "impl", None)       # a wrapper writing through another model class
                if impl is not None:
                    impl.set_vocab = impl._set_vocab_gpt2
                    impl.get_vocab_base_pre = lambda tokenizer: "gpt-2"

        Tiny.__name__ = cls.__name__
        return Tiny

    c.get_model_class = get_model_class
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", "--outtype", "f32", "--outfile", str(out), *extra, str(hf)]
    try:
        c.main()
    finally:
        sys.argv = argv
        c.get_model_class = real_get_class
        for owner, orig in reversed(patched):
            owner.permute = orig
    return {"qk_permuted": bool(permuted)}


def _main(argv: list[str]) -> int:
    import argparse
    import logging
    import shutil

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--key", required=True)
    ap.add_argument("archs", nargs="+")
    a = ap.parse_args(argv)
    d = converter_dir()
    sys.path.insert(0, str(d / "gguf-py"))
    sys.path.insert(0, str(d))
    for m in [m for m in sys.modules if m == "gguf" or m.startswith("gguf.")]:
        del sys.modules[m]  # the converter's own gguf-py, not the installed one
    logging.basicConfig(level=logging.WARNING)
    tok_dir = root() / f"tokenizer-{a.key}"
    if not (tok_dir / "tokenizer.json").is_file():
        tmp = tok_dir.with_suffix(".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        _tokenizer(tmp)
        shutil.rmtree(tok_dir, ignore_errors=True)
        tmp.rename(tok_dir)
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(tok_dir)
    failed = 0
    for arch in a.archs:
        spec = BY_ARCH[arch]
        p = paths(arch, a.key)
        tmp = p["dir"].with_suffix(".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            _make_checkpoint(spec, tmp / "hf", tok)
            meta = _convert(tmp / "hf", tmp / "model.gguf", spec.convert_args)
            meta.update(arch=arch, config=spec.config, model_class=spec.model_class, kwargs=spec.config_kwargs(),
                        init_std=INIT_STD, seed=SEED)
        except BaseException as e:  # noqa: BLE001 -- recorded per architecture, the others go on
            import traceback

            failed += 1
            meta = {"arch": arch, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
            print(f"{arch}: {meta['error']}", file=sys.stderr)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
        shutil.rmtree(p["dir"], ignore_errors=True)
        tmp.rename(p["dir"])
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
