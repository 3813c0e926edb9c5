"""Where convgen's templates and device headers live, and a hash of them for cache keys.

The templates ship inside the wheel as the package ``convgen.templates`` (mapped
from the top-level ``templates/`` folder in pyproject.toml); in a source checkout
the folder is read directly, so an edit shows up without reinstalling.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path


@functools.lru_cache(maxsize=None)
def templates_dir() -> Path:
    checkout = Path(__file__).resolve().parent.parent / "templates"
    if checkout.is_dir():
        return checkout
    from importlib.resources import files

    return Path(str(files("convgen.templates")))


def include_dir() -> Path:
    """The folder the emitted kernels' ``#include "convgen/device.h"`` is found in: the
    compilers get it as ``-I``, and ``convgen emit -o DIR`` copies its files to DIR."""
    return templates_dir() / "include"


def device_headers() -> list[Path]:
    """The fixed device headers, relative to :func:`include_dir`."""
    root = include_dir()
    return sorted(p.relative_to(root) for p in root.rglob("*.h"))


def templates_hash() -> str:
    """sha256 over every template's and device header's name and bytes: any edit of either
    changes every cache key (the header is compiled into every kernel)."""
    h = hashlib.sha256()
    root = templates_dir()
    for path in sorted([*root.rglob("*.j2"), *root.rglob("*.h")]):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()
