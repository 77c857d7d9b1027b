"""``moa-cpp client``: the drafter here, the target on a ``moa-cpp serve`` (client-server MoA).

Exit status: 0 = everything verified; 3 = finished with an unverified tail (the server did not
come back in time); 2 = error. In a terminal, unverified text is shown dim and withdrawn text is
erased; a pipe gets verified text only (status on stderr). ``--json``: the last stdout line is one
JSON object (text, tokens, unverified, finish_reason, stats)."""
from __future__ import annotations

import argparse
import json
import os
import sys

from moa_cpp.cli.values import positive
from moa_cpp.errors import InvalidArgumentError

DIM, RESET = "\x1b[2m", "\x1b[0m"


def add_client_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", required=True, help="the moa-cpp serve URL, e.g. http://127.0.0.1:8765")
    p.add_argument("-m", "--model", help="the target GGUF (its vocabulary; default: the embedded default target)")
    p.add_argument("-d", "--drafter", help="the MoA drafter GGUF (default: the embedded default drafter)")
    p.add_argument("--bundle", metavar="DIR",
                   help="a client bundle (moa-cpp bundle) instead of -m/-d; with none of the three, the server's "
                        "bundle is downloaded (and cached) if it serves one, else the embedded defaults are used")
    p.add_argument("--api-key-file", metavar="FILE", help="file whose first key line is used; else $MOA_API_KEY")
    p.add_argument("--trust-server-bundle", action="store_true",
                   help="download and run the client bundle the server offers (files it sends are parsed here)")
    p.add_argument("--bundle-id", metavar="ID",
                   help="accept the server's client bundle only if it is exactly this bundle_id (pinned consent)")
    p.add_argument("-p", "--prompt", required=True, help="prompt text")
    p.add_argument("--chat", action="store_true", help="apply the target GGUF's chat template")
    p.add_argument("-n", "--max-tokens", dest="max_tokens", type=positive, default=256, help="max new tokens")
    p.add_argument("--draft", default="chain:4", help="chain:N or tree:DEPTH,TOPK,TOTAL (default chain:4)")
    p.add_argument("--temp", type=float, default=0.0, help="temperature (0 = greedy)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--ignore-eos", action="store_true", help="never stop at an end-of-generation token")
    p.add_argument("--ca-dtype", default="f16", choices=["f16", "q8_0", "f32"], help="CA K/V on the wire")
    p.add_argument("--max-unverified", type=positive, default=128,
                   help="tokens drafted alone while the server is away (default 128)")
    p.add_argument("--resync-wait", type=float, default=30.0,
                   help="seconds to wait at the unverified limit for the server to return (default 30)")
    p.add_argument("--timeout", type=float, default=10.0, help="per-request timeout in seconds (default 10)")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")


def _api_key(args: argparse.Namespace):
    if args.api_key_file:
        from moa_cpp.server.auth import load_api_keys
        return load_api_keys(args.api_key_file)[0]
    return os.environ.get("MOA_API_KEY") or None


class _Renderer:
    """Terminal: verified text plain, unverified dim, withdrawn text erased. Pipe: verified text
    only (an unverified token is printed once it is confirmed)."""

    def __init__(self, vocab, tty: bool) -> None:
        self.vocab, self.tty = vocab, tty
        self.pending: list = []           # unverified token ids, in order

    def _text(self, ids) -> str:
        return self.vocab.detokenize(list(ids)).decode("utf-8", "replace")

    def __call__(self, ev) -> None:
        out = sys.stdout
        if ev.kind == "tokens" and ev.verified:
            out.write(self._text(ev.ids))
        elif ev.kind == "tokens":
            self.pending += ev.ids
            if self.tty:
                out.write(DIM + self._text(ev.ids) + RESET)
        elif ev.kind == "confirm":
            done, self.pending = self.pending[: ev.n], self.pending[ev.n:]
            if self.tty:
                self._erase(done + self.pending)
            out.write(self._text(done))
            if self.tty and self.pending:
                out.write(DIM + self._text(self.pending) + RESET)
        elif ev.kind == "rollback":
            if self.tty:
                self._erase(self.pending)
            self.pending = []
        elif ev.kind == "status":
            print(f"[{ev.state}]", file=sys.stderr, flush=True)
        out.flush()

    def _erase(self, ids: list) -> None:
        n = len(self._text(ids))
        if n:
            sys.stdout.write("\b" * n + " " * n + "\b" * n)


def run_client(args: argparse.Namespace) -> int:
    from moa_cpp.models import defaults
    from moa_cpp.remote.client import RemoteError, RemoteGenerator

    if args.temp < 0 or not (0 < args.top_p <= 1) or args.top_k < 0:
        raise InvalidArgumentError("--temp must be >= 0, --top-p in (0, 1], --top-k >= 0")
    files: dict = {}
    if getattr(args, "bundle", None):
        if args.model or args.drafter:
            raise InvalidArgumentError("--bundle replaces -m/--model and -d/--drafter: pass one or the other")
        files = {"bundle": args.bundle}
    elif args.model or args.drafter:
        target = args.model or defaults.default_target()
        drafter = args.drafter or (defaults.default_drafter() if args.model is None else None)
        if drafter is None:
            raise InvalidArgumentError("-m/--model needs -d/--drafter (the MoA drafter trained for it)")
        files = {"drafter": drafter, "target": target}
    if files and (args.trust_server_bundle or args.bundle_id):
        raise InvalidArgumentError("--trust-server-bundle / --bundle-id are about the server's bundle: not with "
                                   "--bundle or -m/-d (your own files)")
    remote_gen = RemoteGenerator(args.server, **files, api_key=_api_key(args), draft=args.draft,
                                 trust_server_bundle=args.trust_server_bundle, bundle_id=args.bundle_id,
                                 ca_dtype=args.ca_dtype, timeout=args.timeout, max_unverified=args.max_unverified,
                                 resync_wait=args.resync_wait)
    prompt = args.prompt
    if args.chat:
        prompt = remote_gen.chat_prompt([{"role": "user", "content": args.prompt}])
    tty = sys.stdout.isatty() and not args.json
    on_event = None if args.json else _Renderer(remote_gen.vocab, tty)
    try:
        r = remote_gen.generate(prompt, max_tokens=args.max_tokens, temperature=args.temp, top_k=args.top_k,
                                top_p=args.top_p, seed=args.seed, ignore_eos=args.ignore_eos, on_event=on_event)
    except RemoteError as e:
        said = f"the server answered {e.status} {e.kind}: " if e.status else ""
        print(f"moa-cpp client: error: {said}{e}", file=sys.stderr)
        return 2
    finally:
        remote_gen.close()
    st = r.stats
    if args.json:
        print(json.dumps({"text": r.text, "tokens": r.tokens, "unverified": r.unverified,
                          "unverified_text": remote_gen.vocab.detokenize(r.unverified).decode("utf-8", "replace"),
                          "finish_reason": r.finish_reason, "stats": st.to_dict()}), flush=True)
    else:
        sys.stdout.write("\n")
        print(f"[{len(r.tokens)} verified tokens, {len(r.unverified)} unverified, {st.server_calls} server calls, "
              f"tau {st.tau:.2f}, {st.bytes_received} B received]", file=sys.stderr, flush=True)
    return 3 if r.unverified or r.finish_reason == "unverified" else 0
