"""Training MoA drafters (``moa-cpp train``; needs the ``train`` extra, i.e. PyTorch).

Modules (torch is imported by ``target_torch``, ``model``, ``masks``, ``trainer`` and its parts;
importing this package, ``data``, ``sharegpt`` or ``vocab`` does not):

- :mod:`moa_cpp.train.data`: self-distilled data generated with llama.cpp (token ids + manifest); its
  prompts: :mod:`moa_cpp.train.prompts`.
- :mod:`moa_cpp.train.sharegpt`: ShareGPT V3 prompts (streaming reader of the truncated JSON).
- :mod:`moa_cpp.train.exclusion`: prompts never trained on (eval repeats, held-out sets).
- :mod:`moa_cpp.train.target_torch`: the frozen GGUF target re-run in PyTorch (features).
- :mod:`moa_cpp.train.model`: the drafter in PyTorch (HF tensor names, Format-B save).
- :mod:`moa_cpp.train.vocab`: the reduced draft vocabulary (top-V response tokens, ``d2t``).
- :mod:`moa_cpp.train.masks`: the T-step-bounded CA and staircase SA masks (docs/drafter.md#training-masks).
- :mod:`moa_cpp.train.trainer`: the recipe's loop (:class:`Trainer`: schedule, resume, checkpoints), with
  its parts: :mod:`~moa_cpp.train.settings` (``TrainSettings``, LR schedule), :mod:`~moa_cpp.train.devices`
  (device, bf16), :mod:`~moa_cpp.train.optim` (AdamW / Muon), :mod:`~moa_cpp.train.features` (target
  features), :mod:`~moa_cpp.train.packing` and :mod:`~moa_cpp.train.batches` (batches),
  :mod:`~moa_cpp.train.loss`, :mod:`~moa_cpp.train.evaluate` (held-out acceptance).
- :mod:`moa_cpp.train.paired`: paired comparisons of drafters (bootstrap intervals of held-out tau).
- :mod:`moa_cpp.train.cli`: the ``moa-cpp train`` subcommand.
"""
