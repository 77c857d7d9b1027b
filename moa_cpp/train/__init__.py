"""Training MoA drafters (``moa-cpp train``; needs the ``train`` extra, i.e. PyTorch).

Modules (torch is imported by ``target_torch``, ``model``, ``masks`` and ``trainer``;
importing this package, ``data``, ``sharegpt`` or ``vocab`` does not):

- :mod:`moa_cpp.train.data`: self-distilled data generated with llama.cpp (token ids + manifest).
- :mod:`moa_cpp.train.sharegpt`: ShareGPT V3 prompts (streaming reader of the truncated JSON, eval filter).
- :mod:`moa_cpp.train.target_torch`: the frozen GGUF target re-run in PyTorch (features).
- :mod:`moa_cpp.train.model`: the drafter in PyTorch (HF tensor names, Format-B save).
- :mod:`moa_cpp.train.vocab`: the reduced draft vocabulary (top-V response tokens, ``d2t``).
- :mod:`moa_cpp.train.masks`: the T-step-bounded CA and staircase SA masks (spec §21.3).
- :mod:`moa_cpp.train.trainer`: the §21 recipe (loss, schedule, resume, held-out acceptance).
- :mod:`moa_cpp.train.cli`: the ``moa-cpp train`` subcommand.
"""
