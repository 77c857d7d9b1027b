"""The MoA drafter: the cffi binding of ``native/include/moa.h`` (``native``), the friendly
classes over it (``drafter``: :class:`~moa_cpp.drafter.drafter.DrafterModel`,
:class:`~moa_cpp.drafter.drafter.DrafterState`, :class:`~moa_cpp.drafter.drafter.Drafter`) and the
check against the official reference's golden outputs (``parity``).

Light on purpose: ``from moa_cpp.drafter import DrafterModel`` loads the native library only when asked.
"""
from __future__ import annotations

_PUBLIC = ("Drafter", "DrafterModel", "DrafterState")


def __getattr__(name: str):
    if name in _PUBLIC:
        from moa_cpp.drafter import drafter
        return getattr(drafter, name)
    raise AttributeError(name)
