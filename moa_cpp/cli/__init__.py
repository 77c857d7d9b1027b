"""The ``moa-cpp`` command line: ``main`` (the dispatcher), one module per command (``generate``,
``chat``, ``serve`` (and ``rpc-server``), ``client``, ``bundle``; ``train`` lives in
:mod:`moa_cpp.train.cli`, ``convert`` in :mod:`moa_cpp.convert`, ``check-parity`` in
:mod:`moa_cpp.drafter.parity`), the llama.cpp flag spellings they share (``llama_flags``) and
argparse value types (``values``).
"""
