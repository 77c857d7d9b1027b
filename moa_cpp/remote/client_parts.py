"""What a client of client-server MoA loads once and every generation works with
(:class:`ClientParts`): the files (:mod:`.files`), the drafter with its proposer and state, the
target's vocabulary, the connection to the server (:mod:`.transport`) and the run settings.
:class:`~.client.RemoteGenerator` is these parts plus generating; each generation's
:class:`~.run.RemoteRun` reads them.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional, Union

from moa_cpp.drafter.drafter import DrafterModel
from moa_cpp.generator import parse_draft
from moa_cpp.speculative.proposers import make_proposer, moa_state
from moa_cpp.remote import protocol as P
from moa_cpp.remote.files import resolve_files
from moa_cpp.remote.transport import Transport

PathLike = Union[str, Path, None]


class ClientParts:
    """The loaded parts of a client (the arguments: :class:`~.client.RemoteGenerator`)."""

    def __init__(self, url: str, *, bundle: PathLike = None, drafter: PathLike = None, target: PathLike = None,
                 api_key: Optional[str] = None, draft: str = "chain:4", ca_dtype: str = "f16", timeout: float = 30.0,
                 n_ctx: int = 4096, n_threads: Optional[int] = None, use_msgpack: bool = True,
                 max_unverified: int = 128, resync_wait: float = 30.0, probe_timeout: float = 1.0,
                 on_call: Optional[Callable[[dict], None]] = None, trust_server_bundle: bool = False,
                 bundle_id: Optional[str] = None) -> None:
        import llama_cpp

        from moa_cpp.target.llama_log import log_chosen, set_llama_log
        if not log_chosen():                 # llama.cpp's log lines only if someone asked for them
            set_llama_log(False)
        if ca_dtype not in P.CA_DTYPES:
            raise ValueError(f"ca_dtype must be one of {', '.join(P.CA_DTYPES)}")
        self.draft = parse_draft(draft)
        if self.draft.mode not in ("chain", "tree"):
            raise ValueError("draft must be chain:N or tree:D,K,T in client-server mode")
        self.ca_dtype = ca_dtype
        key = api_key if api_key is not None else os.environ.get("MOA_API_KEY") or None
        drafter, target, vocab_path, self.bundle = resolve_files(url, key, timeout, bundle, drafter, target,
                                                                 trust_server_bundle, bundle_id)
        self.bundle_id: Optional[str] = self.bundle.bundle_id if self.bundle is not None else None
        self.model = DrafterModel(drafter, target, n_threads=n_threads)
        self.max_unverified, self.resync_wait, self.probe_timeout = int(max_unverified), resync_wait, probe_timeout
        # offline drafting keeps the unverified chain as pending draft rows
        self.proposer = make_proposer("moa", None, self.draft, drafter=self.model, n_ctx=n_ctx,
                                      n_draft_max=max(1 + 16 * 16, self.max_unverified + 2))
        self.state = moa_state(self.proposer)
        self.vocab = llama_cpp.Llama(str(vocab_path), vocab_only=True, verbose=False)
        self.n_ctx, self.n_vocab = int(n_ctx), int(self.vocab.n_vocab())
        ctype = P.MSGPACK if use_msgpack and P.has_msgpack() else P.JSON
        self.http = Transport(url, key, timeout, ctype)
        self.on_call = on_call

    def close(self) -> None:
        self.http.close()
