"""``moa-cpp serve`` (the OpenAI-compatible server) and ``moa-cpp rpc-server`` (llama.cpp's RPC
backend server, for targets split over machines)."""
from __future__ import annotations

import argparse
import logging
import socket
import sys

from moa_cpp.errors import InvalidArgumentError, MoaError

log = logging.getLogger("moa_cpp.server")


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    from moa_cpp.server.settings import add_serve_arguments as add
    add(p)


def _import_web_stack() -> None:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise MoaError(f"`moa-cpp serve` needs the server extra ({e.name} is missing): "
                       "pip install -e '.[server]' (scripts/setup.sh installs it)") from None


def _listen(host: str, port: int) -> socket.socket:
    """Bind before loading anything slow is not needed; bind here so --port 0 tells its port."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    if not infos:
        raise InvalidArgumentError(f"cannot resolve --host {host}")
    family, _, _, _, addr = infos[0]
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP;
    # with proto 0, Nagle holds each response's body until the client ACKs its headers (~40 ms)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise MoaError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def run_serve(args: argparse.Namespace) -> int:
    _import_web_stack()
    import uvicorn

    from moa_cpp.server.app import create_app
    from moa_cpp.server.auth import check_bind
    from moa_cpp.server.sessions import build_sessions
    from moa_cpp.server.settings import settings_from_args
    from moa_cpp.target.llama_log import set_llama_log

    settings = settings_from_args(args)
    check_bind(settings.host, bool(settings.api_keys), settings.insecure_no_auth)
    set_llama_log(bool(args.llama_verbose))
    sock = _listen(settings.host, settings.port)
    if settings.bundle:
        # before loading anything: a bundle of other files would only give 409s to its clients
        from moa_cpp.remote.bundle import check_server_bundle
        from moa_cpp.server.sessions import resolve_models
        target_path, drafter_path, _, _, _ = resolve_models(settings)
        check_server_bundle(settings.bundle, drafter_path, target_path)
    if settings.rpc:
        from moa_cpp.target.rpc import is_loopback
        for ep in settings.rpc:
            if not is_loopback(ep.rpartition(":")[0].strip("[]")):
                log.warning("--rpc %s: the target's weights and activations travel to it unencrypted and "
                            "unauthenticated (llama.cpp's RPC protocol): use it on a private network only", ep)
    sessions = build_sessions(settings)
    if settings.rpc:
        # after the model is loaded: its connections to the rpc-servers exist now
        from moa_cpp.server.rpc_watch import start_watchdog
        start_watchdog(settings.rpc)
    gen0 = sessions[0].gen
    if gen0.proposer is not None:
        # before listening: a first request would otherwise wait for it (seconds; a client may time out)
        what = "verify cost and exact batch size" if gen0.draft.mode == "auto" else "exact batch size"
        print(f"[measuring the target's {what} once (cached for later runs)...]", file=sys.stderr, flush=True)
        gen0.calibrate()
    from moa_cpp.cli.generate import prefill_shape
    for session in sessions:    # the prompt cache's prefill chunk, before a request waits for it
        prefill_shape(session.gen)
    app = create_app(settings, sessions)
    srv = app.state.server
    host, port = sock.getsockname()[:2]
    url_host = f"[{host}]" if ":" in host else host

    class _Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            if not self.should_exit:
                print(f"moa-cpp serve: listening on http://{url_host}:{port}", flush=True)
                shape = (f"{len(sessions)} slots batched on {settings.session_threads()} thread(s)" if settings.batching()
                         else f"{len(sessions)} session(s) x {settings.session_threads()} thread(s)")
                print(f"[{srv.model}: {shape}, "
                      f"n_ctx {srv.n_ctx}, draft {gen0.draft} ({gen0.spec_type}), auth {'on' if settings.api_keys else 'off'}]",
                      file=sys.stderr, flush=True)

        def handle_exit(self, sig, frame) -> None:
            srv.shutdown()                    # open streams end with their last chunk and [DONE]
            super().handle_exit(sig, frame)
            # a clean shutdown exits 0 (uvicorn would re-raise the signal after it)
            getattr(self, "_captured_signals", []).clear()

    from moa_cpp.server.connections import guarded_h11
    config = uvicorn.Config(app, log_level="debug" if getattr(args, "verbose", False) else "warning",
                            access_log=bool(getattr(args, "verbose", False)), timeout_graceful_shutdown=10,
                            server_header=False,   # nothing to advertise, and ~20 B less per MoA cycle
                            timeout_keep_alive=75,  # a client between cycles / prompts keeps its connection
                            # no limit_concurrency: it counted idle sockets against working clients;
                            # the guarded protocol bounds sockets, the session pool bounds the work
                            http=guarded_h11(settings.head_timeout_s, settings.max_connections),
                            lifespan="off")
    server = _Server(config)
    try:
        server.run(sockets=[sock])
    finally:
        srv.executor.shutdown(wait=True, cancel_futures=True)
        for s in sessions:
            s.gen.close()
        engine = getattr(sessions[0].gen.target, "engine", None)
        if engine is not None:
            engine.close()                    # the slots' shared context
    return 0


def add_rpc_server_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", "-H", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", "-p", type=int, default=50052, help="port (default 50052, as llama.cpp's rpc-server)")
    p.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (default: all)")
    p.add_argument("--cache", metavar="DIR", help="local cache of tensors sent by clients (llama.cpp's -c)")
    p.add_argument("--allow-remote", action="store_true",
                   help="bind a non-loopback address: rpc-server has NO authentication; private networks only")


def run_rpc_server(args: argparse.Namespace) -> int:
    import signal

    from moa_cpp.target.rpc import is_loopback, start_server
    if not is_loopback(args.host) and not args.allow_remote:
        raise InvalidArgumentError(f"refusing to serve the RPC backend on {args.host}: it has no authentication "
                                   "(anyone reaching the port controls this process's memory). Use a private "
                                   "network and pass --allow-remote")
    if not 0 < args.port < 65536:
        raise InvalidArgumentError("--port must be 1..65535")
    print(f"moa-cpp rpc-server: serving the CPU backend on {args.host}:{args.port} (no authentication)", flush=True)
    signal.signal(signal.SIGINT, signal.SIG_DFL)      # the server loop is native: let ^C end the process
    start_server(args.host, args.port, args.threads, args.cache)
    # the native loop only returns when it could not listen
    raise MoaError(f"could not listen on {args.host}:{args.port} (in use?)")
