"""The target: a GGUF model in its own llama.cpp context whose every decode also captures
per-layer K/V (:class:`~moa_cpp.target.target.Target`), and what runs it.

One file per concern: ``setup`` (loading, context parameters), ``text`` (tokens, chat template),
``context`` (decode, capture, KV cache), ``target`` (:class:`Target` = the three, plus measured
exact batch sizes), ``slots`` (continuous batching: several generations on one context),
``exactness`` / ``batch_pad`` / ``ubatch_order`` (when a batch's rows equal plain decoding's),
``calibration`` (the on-disk cache of those measurements), ``batch`` (the reusable llama_batch),
``text_stream`` (streamed text), ``llama_log`` (llama.cpp's log), ``omp_pool`` / ``machine_load``
(threads and timing), ``devices`` / ``rpc`` (where the layers run).

Light on purpose: ``from moa_cpp.target import Target`` imports llama.cpp only when asked.
"""
from __future__ import annotations


def __getattr__(name: str):
    if name == "Target":
        from moa_cpp.target.target import Target
        return Target
    raise AttributeError(name)
