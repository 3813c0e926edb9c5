"""The emitter's old name for an arch description (convgen/targets.py).

``backend_for(target)`` is the target's :class:`~convgen.targets.Arch`, which carries what
the CUDA/WMMA and HIP/rocWMMA sources differ in under the attribute names the templates
read (``be.includes``, ``be.wmma_ns``, ...).  Kept so emit.py's import stands while it is
rewritten; new code reads ``target.info``.
"""

from __future__ import annotations

from .ir import Target
from .targets import Arch as Backend

__all__ = ["Backend", "backend_for"]


def backend_for(target: Target) -> Backend:
    return target.info
