"""``moa-cpp bundle``: write the client bundle of client-server MoA (the drafter without the
server-only parts, the target's token embedding and tokenizer; :mod:`moa_cpp.remote.bundle_write`)."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from moa_cpp.errors import InvalidArgumentError
from moa_cpp.remote.bundle_write import EMBD_TYPES



def add_bundle_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", help="the target GGUF (default: the embedded default target)")
    p.add_argument("-d", "--drafter", help="the full MoA drafter GGUF (default: the embedded default drafter)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="bundle directory to write")
    p.add_argument("--embd-type", choices=EMBD_TYPES, default="keep",
                   help="type of the bundled token embedding: keep the target's (default), or requantize")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_bundle(args: argparse.Namespace) -> int:
    from moa_cpp.models import defaults
    from moa_cpp.remote.bundle import BUNDLE_FILES, fmt_size
    from moa_cpp.remote.bundle_write import make_bundle
    if args.model is not None and args.drafter is None:
        raise InvalidArgumentError("-m/--model needs -d/--drafter (the MoA drafter trained for it)")
    target = args.model or defaults.default_target()
    drafter = args.drafter or defaults.default_drafter()
    m = make_bundle(target, drafter, args.output, embd_type=args.embd_type, progress=not args.no_progress)
    out = Path(args.output)
    total = 0
    for name in BUNDLE_FILES:
        total += m["files"][name]["size"]
        print(f"{out / name}: {fmt_size(m['files'][name]['size'])}")
    print(f"bundle {out}: {fmt_size(total)} in all (drafter '{Path(drafter).name}' "
          f"{fmt_size(os.path.getsize(drafter))}, target '{Path(target).name}' {fmt_size(os.path.getsize(target))}); "
          f"bundle_id {m['bundle_id']}")
    return 0
