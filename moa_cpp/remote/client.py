"""The client of client-server MoA: the drafter runs here, the target on a ``moa-cpp serve``.

:class:`RemoteGenerator` loads the files (:mod:`.files`), holds the drafter, the vocabulary and
the connection (:mod:`.transport`) -- its :class:`~.client_parts.ClientParts` -- and runs each
generation as a :class:`~.run.RemoteRun`: one server call per cycle, so calls per generated token
= 1/tau.

Example::

    from moa_cpp.remote.client import RemoteGenerator
    remote_gen = RemoteGenerator("http://127.0.0.1:8765", drafter="drafter.gguf", target="target.gguf")
    r = remote_gen.generate("def fib(n):", max_tokens=64)
    print(r.text, r.stats)
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

from moa_cpp.remote.client_parts import ClientParts
from moa_cpp.remote.results import Event, RemoteResult, RemoteStats
from moa_cpp.remote.run import RemoteRun
from moa_cpp.remote.transport import RemoteError

# the public names of client-server MoA's client, importable from here
__all__ = ["RemoteGenerator", "RemoteError", "RemoteResult", "RemoteStats", "Event"]


class RemoteGenerator(ClientParts):
    """Generate with the drafter here and the target on a ``moa-cpp serve`` at ``url``.

    What the client loads, in order (:func:`~moa_cpp.remote.files.resolve_files`):

    - ``bundle``: a client bundle directory (``moa-cpp bundle``): its ``client.gguf`` (the drafter
      without the server-only parts, with the token embedding) and ``vocab.gguf`` (tokenizer and
      chat template). Its ``bundle_id`` goes with every open; a server with other files answers
      409 ``bundle_mismatch`` (raised as :class:`RemoteError`).
    - ``drafter`` and ``target``: the full drafter GGUF and the target GGUF (only its vocabulary,
      metadata and embedding are read here).
    - neither: the server's bundle if it serves one (``moa-cpp serve --bundle``) and the user
      consents (``trust_server_bundle=True``, or ``bundle_id=`` pinning exactly that bundle: its
      files are parsed and run here), downloaded once into ``<cache>/bundles/<bundle_id>/`` and
      checked against its sha256 (every read bounded); without consent a BundleError says how to
      give it. A server without a bundle: the embedded default drafter and target.

    ``on_call`` (None: no tracing work): called with one dict per server call once its cycle is
    done (``bench/remote/sim.py``'s trace; fields in :func:`~moa_cpp.remote.run.call_record`).

    Greedy output equals the target's plain greedy decoding; with temperature > 0 every token is
    the target's own sample (drafts are deterministic and verified as point masses)."""

    _last_run: Optional[RemoteRun] = None     # the latest generation (verify_pending resumes only it)

    def chat_prompt(self, messages: list) -> list:
        """Token ids of ``messages`` in the target GGUF's chat template (as single-device
        ``generate(chat=True)`` builds them)."""
        from moa_cpp.chat_template import render_chat_template
        template = self.vocab.metadata.get("tokenizer.chat_template")
        if not template:
            raise ValueError("the target GGUF has no chat template; send a plain prompt")
        v = self.vocab

        def special(tok: int) -> str:
            return v.detokenize([tok], special=True).decode("utf-8", "replace") if tok >= 0 else ""
        text = render_chat_template(template, messages, special(v.token_bos()), special(v.token_eos()))
        return v.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def encode(self, prompt: Union[str, Sequence[int]]) -> list:
        if isinstance(prompt, str):
            return self.vocab.tokenize(prompt.encode("utf-8"), add_bos=True, special=False)
        return [int(t) for t in prompt]

    def generate(self, prompt: Union[str, Sequence[int]], *, max_tokens: int = 256, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: Optional[int] = None, ignore_eos: bool = False,
                 on_event: Optional[Callable[[Event], None]] = None) -> RemoteResult:
        """Generate; through a disconnection it keeps drafting alone (unverified tokens), then
        resyncs (or reopens by replay) when the server is back. ``on_event`` sees every
        :class:`Event` as it happens. ``ignore_eos``: the server never stops at an
        end-of-generation token (llama.cpp's ``--ignore-eos``)."""
        sampling = {"temperature": float(temperature), "top_k": int(top_k), "top_p": float(top_p)}
        if ignore_eos:
            sampling["ignore_eos"] = True
        if seed is not None:
            sampling["seed"] = int(seed)
        run = self._last_run = RemoteRun(self, self.encode(prompt), int(max_tokens), sampling, on_event, self.on_call)
        return run.go()

    def verify_pending(self, result: RemoteResult, wait: float = 30.0) -> RemoteResult:
        """Resolve a result that ended with an unverified tail (``finish_reason == "unverified"``:
        the server did not come back in time): wait up to ``wait`` seconds for the server, have
        the tail confirmed or rolled back, and finish the generation. Events go to the same
        ``on_event``; the new result's events and stats continue the old ones. Only the latest
        generation of this generator can be resumed (the drafter state is its)."""
        if result.finish_reason != "unverified":
            return result
        if result._run is None or result._run is not self._last_run:
            raise ValueError("only the latest generation of this RemoteGenerator can be resumed")
        return result._run.resume(wait)
