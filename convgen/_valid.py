"""The integer check every spec field goes through (IR, main-loop kinds, targets)."""

from __future__ import annotations

from typing import Any


def as_int(name: str, value: Any) -> int:
    """``value`` as a plain int, or a ValueError naming ``name``.  NumPy integers are
    accepted (shapes often come from arrays) and converted, so keys hash alike."""
    # bool is an int subclass; True as a channel count is always a mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            import numpy as np

            if isinstance(value, np.integer):
                return int(value)
        except ImportError:  # pragma: no cover - numpy is a dependency
            pass
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return value
