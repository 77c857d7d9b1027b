"""python -m bench.remote COMMAND: client-server MoA."""
from bench.common import dispatch

COMMANDS = {
    "sim": ("bench.remote.sim", "latency model, a live check through the fault proxy, and disconnection runs"),
    "bytes": ("bench.remote.bytes", "server calls and bytes per verified token by draft shape and CA dtype"),
}

if __name__ == "__main__":
    raise SystemExit(dispatch("remote", COMMANDS, __doc__))
