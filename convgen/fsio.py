"""The one way convgen publishes a file: atomically, with no locks.

The compile cache, the tuning database and bench results are all read by other processes
while they may be written.  Each writer writes its own temporary file in the target's own
folder (so the rename never crosses a filesystem), fsyncs it, and ``os.replace``-s it over
the target: a reader sees the old file or the new one, never half of one; two writers of
the same file each publish a whole file and the last rename wins; a killed writer leaves
at worst a stray ``.<name>.<pid>.*.tmp`` file, never a lock that would hang the next run.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Union


def atomic_write(path: Union[str, Path], data: Union[bytes, str], *, mode: int = 0o644) -> Path:
    """Publish `data` (text is UTF-8 encoded) at `path`, creating its folder.

    `mode` is set on the temporary file before the rename: mkstemp's 0600 would hide a
    shared cache from the other users of a machine.  Raises OSError (and leaves no
    temporary file) when the folder cannot be created or written."""
    path = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=folder)
    tmp: Path | None = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            if hasattr(os, "fchmod"):
                os.fchmod(f.fileno(), mode)
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    finally:
        if tmp is not None:
            try:
                tmp.unlink()
            except OSError:
                pass
    return path
