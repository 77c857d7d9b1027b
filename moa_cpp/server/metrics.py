"""``GET /metrics``: Prometheus text format (``prometheus_client``), on with ``--metrics`` as in
llama-server.

llama.cpp's names where it has the quantity (so existing llama-server dashboards work):
``llamacpp:prompt_tokens_total``, ``llamacpp:prompt_seconds_total``,
``llamacpp:tokens_predicted_total``, ``llamacpp:tokens_predicted_seconds_total``,
``llamacpp:n_decode_total``, ``llamacpp:prompt_tokens_seconds`` and
``llamacpp:predicted_tokens_seconds`` (throughput gauges), ``llamacpp:requests_processing``,
``llamacpp:requests_deferred``. Speculation under vLLM's names (``spec_decode_num_drafts``,
``..._num_draft_tokens``, ``..._num_accepted_tokens``) with the ``moa:`` prefix and a
``proposer`` label (moa, ngram, draft), plus ``moa:spec_decode_tau`` (tokens per target call
over the server's lifetime) and ``moa:requests_total`` by route and finish reason. With
continuous batching: ``moa:batch_calls`` (llama_decode calls of the shared context),
``moa:batch_sets`` (cycles that decoded every generating slot's rows together) and
``moa:batch_rows`` (rows decoded), so a dashboard sees how many users share a pass.
"""
from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from moa_cpp.server.errors import APIError


class ServerMetrics:
    """Counters of one server process (its own registry: several apps in one process, as in tests,
    never share counts)."""

    def __init__(self, srv: Any, enabled: bool) -> None:
        self.srv, self.enabled = srv, enabled
        self.lock = threading.Lock()
        r = self.registry = CollectorRegistry()
        self.prompt_tokens = Counter("llamacpp:prompt_tokens", "Number of prompt tokens processed.", registry=r)
        self.prompt_seconds = Counter("llamacpp:prompt_seconds", "Prompt process time", registry=r)
        self.predicted = Counter("llamacpp:tokens_predicted", "Number of generation tokens processed.", registry=r)
        self.predicted_seconds = Counter("llamacpp:tokens_predicted_seconds", "Predict process time", registry=r)
        self.n_decode = Counter("llamacpp:n_decode", "Total number of llama_decode() calls", registry=r)
        self.prompt_tps = Gauge("llamacpp:prompt_tokens_seconds", "Average prompt throughput in tokens/s.",
                                registry=r)
        self.predicted_tps = Gauge("llamacpp:predicted_tokens_seconds", "Average generation throughput in tokens/s.",
                                   registry=r)
        self.processing = Gauge("llamacpp:requests_processing", "Number of requests processing.", registry=r)
        self.deferred = Gauge("llamacpp:requests_deferred", "Number of requests deferred.", registry=r)
        self.drafts = Counter("moa:spec_decode_num_drafts", "Verification cycles that verified drafts.",
                              registry=r)
        self.draft_tokens = Counter("moa:spec_decode_num_draft_tokens", "Draft tokens proposed, by proposer.",
                                    ["proposer"], registry=r)
        self.accepted = Counter("moa:spec_decode_num_accepted_tokens", "Draft tokens accepted, by proposer.",
                                ["proposer"], registry=r)
        self.tau = Gauge("moa:spec_decode_tau", "Tokens per target verification call (all requests so far).",
                         registry=r)
        self.requests = Counter("moa:requests", "Finished generations by route and finish reason.",
                                ["route", "finish_reason"], registry=r)
        self.batch_calls = Gauge("moa:batch_calls", "llama_decode calls of the batched slots' shared context.",
                                 registry=r)
        self.batch_sets = Gauge("moa:batch_sets", "Cycles that decoded the generating slots' rows together.",
                                registry=r)
        self.batch_rows = Gauge("moa:batch_rows", "Rows decoded by the batched slots' shared context.", registry=r)
        self._calls = self._tokens = 0
        self._sums = [0, 0.0, 0, 0.0]      # prompt tokens, prompt s, predicted tokens, predicted s

    def observe(self, route: str, stats: Any) -> None:
        """One finished generation's statistics (``SpecStats``)."""
        if stats is None:
            return
        with self.lock:
            self.prompt_tokens.inc(stats.n_prompt)
            self.prompt_seconds.inc(stats.t_prefill)
            self.predicted.inc(stats.n_generated)
            self.predicted_seconds.inc(stats.t_total)
            self.n_decode.inc(stats.target_calls + stats.prefill_calls)
            self.drafts.inc(stats.proposed_by_depth[0] if stats.proposed_by_depth else 0)
            for src, c in (stats.by_source or {}).items():
                self.draft_tokens.labels(src).inc(c.get("proposed", 0))
                self.accepted.labels(src).inc(c.get("accepted", 0))
            self._calls += stats.target_calls
            self._tokens += stats.accepted + stats.target_calls
            self.tau.set(self._tokens / self._calls if self._calls else 0.0)
            s = self._sums
            s[0] += stats.n_prompt
            s[1] += stats.t_prefill
            s[2] += stats.n_generated
            s[3] += stats.t_total
            self.prompt_tps.set(s[0] / s[1] if s[1] else 0.0)
            self.predicted_tps.set(s[2] / s[3] if s[3] else 0.0)
            self.requests.labels(route, stats.finish_reason or "length").inc()

    async def endpoint(self, request: Request) -> Response:
        if not self.enabled:
            raise APIError(501, "this server does not serve metrics: start it with --metrics", code="not_supported")
        pool = self.srv.pool
        self.processing.set(pool.busy)
        self.deferred.set(pool.waiting)
        engine = getattr(pool.sessions[0].gen.target, "engine", None) if pool.sessions else None
        if engine is not None:
            self.batch_calls.set(engine.calls)
            self.batch_sets.set(engine.batches)
            self.batch_rows.set(engine.rows)
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

    def routes(self) -> list:
        return [Route("/metrics", self.endpoint, methods=["GET"])]
