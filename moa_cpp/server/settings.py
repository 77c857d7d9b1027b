"""Settings of ``moa-cpp serve``: the flags (llama-server's spellings where it has them) and
every limit on what a client controls."""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Optional

from moa_cpp.cli.values import non_negative as _non_negative, port as _port, positive as _positive
from moa_cpp.cli.llama_flags import add_target_arguments
from moa_cpp.models.defaults import add_spec_arguments


@dataclass
class ServerSettings:
    model: Optional[str] = None             # target GGUF (None: the embedded default)
    drafter: Optional[str] = None           # MoA drafter GGUF, or a plain LLM GGUF (draft model)
    host: str = "127.0.0.1"
    port: int = 8765
    api_keys: list = field(default_factory=list)
    insecure_no_auth: bool = False
    parallel: int = 1                       # pre-allocated sessions
    cont_batching: bool = True              # --parallel > 1: the sessions share one context, one decode per cycle
    queue: int = 16                         # requests waiting for a session beyond them
    n_ctx: int = 4096                       # per session
    threads: Optional[int] = None           # per session (default: cores / parallel)
    n_gpu_layers: int = 0
    device: str = "auto"                    # drafter device
    draft: str = "auto:8"
    spec_type: Optional[str] = None         # who drafts (None: moa / draft / ngram by the models given)
    ngram_n_min: int = 1
    ngram_n_max: int = 3
    draft_min: int = 0
    rpc: tuple = ()
    model_alias: Optional[str] = None
    # limits on what a client controls
    max_body_bytes: int = 1 << 20
    max_tokens_limit: Optional[int] = None  # None: the context size
    max_tree_nodes: int = 62
    metrics: bool = False                   # GET /metrics (llama-server's --metrics)
    cache_ram_mib: int = 8192               # copies of earlier prompts' KV cells in RAM, all sessions (-1: no limit)
    target_options: dict = field(default_factory=dict)   # Target.from_path keywords (cli_llama.target_options)
    cors_origins: tuple = ()                # origins a browser page may call from ("*": any)
    max_resync_tokens: int = 512            # a resync verify's chain, consumed in max_tree_nodes pieces
    max_chain: int = 16
    retry_after_s: int = 1
    body_timeout_s: float = 30.0
    head_timeout_s: float = 10.0            # a request head (line + headers) must arrive within this
    max_connections: int = 64               # open connections; beyond, the longest-idle are closed
    max_sessions_per_key: Optional[int] = None   # client-server sessions one key may hold (None: see effective)
    bundle: Optional[str] = None            # client bundle directory served at /moa/v1/bundle (moa-cpp bundle)
    idle_timeout_s: float = 300.0           # a client-server session unused this long is closed
    allowed_hosts: tuple = ()               # Host names served beyond loopback names ('*': any; see server/hosts.py)

    def sessions_per_key(self) -> int:
        """Client-server sessions one key may hold, queued opens included (0: no limit). Default:
        half the pool (at least 1) when keys are configured, so no key can lock the others out;
        none without keys (every client is the same "key" then)."""
        if self.max_sessions_per_key is not None:
            return self.max_sessions_per_key
        return max(1, self.parallel // 2) if self.api_keys else 0

    def cache_ram_bytes(self) -> int:
        """Each session's share of --cache-ram, in bytes (no limit: 2**62)."""
        if self.cache_ram_mib < 0:
            return 1 << 62
        return (self.cache_ram_mib << 20) // self.parallel

    def batching(self) -> bool:
        """Whether the sessions are slots of one batched context (llama-server's continuous batching)."""
        return self.cont_batching and self.parallel > 1

    def session_threads(self) -> int:
        """Threads of each session's context (batched: of the one shared context)."""
        if self.threads:
            return self.threads
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:
            cores = os.cpu_count() or 1
        return cores if self.batching() else max(1, cores // self.parallel)


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", help="target GGUF (default: the embedded default target)")
    p.add_argument("-d", "-md", "--drafter", "--model-draft", dest="drafter",
                   help="MoA drafter GGUF (default with no -m: the embedded drafter); a plain LLM GGUF drafts "
                        "as a draft model")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=8765, help="port (default 8765; 0 picks a free one)")
    p.add_argument("--api-key-file", metavar="FILE",
                   help="API keys, one per line (lines starting with '#' are comments); else $MOA_API_KEY")
    p.add_argument("--api-key", metavar="KEY",
                   help="one API key (llama-server's flag; it shows in the process list: prefer --api-key-file)")
    p.add_argument("--insecure-no-auth", action="store_true",
                   help="allow a non-loopback --host without an API key")
    p.add_argument("--allowed-hosts", metavar="NAME,...", default="",
                   help="Host header names served besides localhost names on a loopback bind (DNS rebinding "
                        "protection; '*' serves any); on another bind, the only names served if given")
    p.add_argument("--cors-origins", metavar="ORIGIN,...", default="",
                   help="browser origins allowed to call the API (e.g. http://localhost:3000; '*': any): CORS "
                        "headers and preflights; keys still required (sent as headers, never cookies)")
    p.add_argument("--metrics", action="store_true",
                   help="serve Prometheus metrics at GET /metrics (llama-server's flag; behind the API key)")
    p.add_argument("-np", "--parallel", type=_positive, default=1,
                   help="concurrent generations: sessions (context + drafter state) allocated at start (default 1)")
    cb = p.add_mutually_exclusive_group()
    cb.add_argument("-cb", "--cont-batching", dest="cont_batching", action="store_true", default=True,
                    help="with --parallel > 1, decode every generating session's rows in one batch on one context "
                         "(default; llama-server's continuous batching). Trees are verified along their main path")
    cb.add_argument("-nocb", "--no-cont-batching", dest="cont_batching", action="store_false",
                    help="a context of its own per session (each decodes alone; trees verified whole)")
    p.add_argument("-cram", "--cache-ram", dest="cache_ram", type=int, default=8192, metavar="MiB",
                   help="RAM for copies of earlier prompts' KV cells, shared by the sessions (llama-server's flag; "
                        "default 8192, 0: off, -1: no limit): a prompt seen before, after others replaced it in the "
                        "KV cache, is restored instead of decoded again, bit for bit (sessions with a context "
                        "of their own: --parallel 1 or -nocb)")
    p.add_argument("--queue", type=_non_negative, default=16,
                   help="requests that may wait for a session (FIFO); beyond: 503 + Retry-After (default 16)")
    add_target_arguments(p, ctx_help="context size per session (default 4096)",
                         threads_help="CPU threads of the target (default: all cores; with --no-cont-batching "
                                      "per session, default cores / --parallel)")
    p.add_argument("--draft", default="auto:8",
                   help="auto[:KMAX] (cost-aware, default auto:8), chain:N, tree:DEPTH,TOPK,TOTAL or none")
    add_spec_arguments(p)
    p.add_argument("--model-alias", "-a", dest="model_alias", help="model id in /v1/models (default: the file name)")
    p.add_argument("--max-body-bytes", type=_positive, default=1 << 20, help="largest request body (default 1 MiB)")
    p.add_argument("--max-tokens-limit", type=_positive, default=None,
                   help="largest max_tokens a request may ask (default: the context size)")
    p.add_argument("--max-tree-nodes", type=_positive, default=62,
                   help="largest tree a request's moa.draft may ask (default 62)")
    p.add_argument("--max-resync-tokens", type=_positive, default=512,
                   help="longest unverified chain a client-server resync may send in one verify (default 512; "
                        "the server verifies it in pieces of --max-tree-nodes)")
    p.add_argument("--body-timeout", type=float, default=30.0, metavar="S",
                   help="seconds a client has to send its request body (default 30)")
    p.add_argument("--header-timeout", dest="head_timeout", type=float, default=10.0, metavar="S",
                   help="seconds a connection has to send a complete request head (default 10); else it is closed")
    p.add_argument("--max-connections", type=_positive, default=64,
                   help="open connections (default 64); beyond, the longest-idle ones are closed to make room")
    p.add_argument("--max-sessions-per-key", type=_non_negative, default=None, metavar="N",
                   help="client-server sessions one API key may hold, queued opens included (0: no limit; default: "
                        "half of --parallel, at least 1, when keys are set)")
    p.add_argument("--idle-timeout", type=float, default=300.0, metavar="S",
                   help="close a client-server (MoA protocol) session idle this many seconds (default 300)")
    p.add_argument("--bundle", metavar="DIR",
                   help="serve this client bundle (moa-cpp bundle -m T -d D -o DIR) at /moa/v1/bundle; it must have "
                        "been made from this server's drafter and target")
    p.add_argument("--verbose", dest="llama_verbose", action="store_true", help="show llama.cpp's own log lines")
    from moa_cpp.cli.llama_flags import add_llama_arguments
    add_llama_arguments(p)


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    from moa_cpp.server.auth import load_api_keys
    from moa_cpp.target.rpc import parse_endpoints
    from moa_cpp.errors import InvalidArgumentError
    rpc = tuple(parse_endpoints(args.rpc)) if args.rpc else ()
    for name, v in (("--header-timeout", args.head_timeout), ("--body-timeout", args.body_timeout),
                    ("--idle-timeout", args.idle_timeout)):
        if not v > 0:
            raise InvalidArgumentError(f"{name} must be a positive number of seconds, got {v}")
    if args.cache_ram < -1:
        raise InvalidArgumentError(f"--cache-ram must be MiB >= 0, or -1 (no limit), got {args.cache_ram}")
    ngl = args.n_gpu_layers if args.n_gpu_layers is not None else (-1 if rpc else 0)
    from moa_cpp.cli.llama_flags import drafter_device, target_options
    return ServerSettings(target_options=target_options(args), model=args.model, drafter=args.drafter, host=args.host, port=args.port,
                          api_keys=load_api_keys(args.api_key_file, inline=args.api_key), insecure_no_auth=args.insecure_no_auth,
                          parallel=args.parallel, cont_batching=args.cont_batching, queue=args.queue, n_ctx=args.n_ctx, threads=args.threads,
                          n_gpu_layers=ngl, device=drafter_device(args), draft=args.draft, rpc=rpc,
                          spec_type=args.spec_type, ngram_n_min=args.ngram_n_min, ngram_n_max=args.ngram_n_max,
                          draft_min=args.draft_min,
                          model_alias=args.model_alias, max_body_bytes=args.max_body_bytes,
                          max_tokens_limit=args.max_tokens_limit, max_tree_nodes=args.max_tree_nodes,
                          max_resync_tokens=args.max_resync_tokens,
                          body_timeout_s=args.body_timeout, idle_timeout_s=args.idle_timeout,
                          head_timeout_s=args.head_timeout, max_connections=args.max_connections,
                          max_sessions_per_key=args.max_sessions_per_key,
                          bundle=getattr(args, "bundle", None),
                          allowed_hosts=_names(args.allowed_hosts), cors_origins=_names(args.cors_origins),
                          metrics=args.metrics, cache_ram_mib=args.cache_ram)


def _names(csv: str) -> tuple:
    return tuple(h.strip() for h in csv.split(",") if h.strip())
