"""`convgen cache info` and `convgen cache clear`: what the on-disk cache holds, and emptying it.

The cache folder (``config.CACHE_DIR``, else the user cache folder + ``convgen``) holds the
compiled kernels (``kernels/<key>.bin``, see convgen/kernel_store.py), the sources of compiles
that failed (``failed/``), and the tuning database ``convgen tune`` writes
(``tuning.json``).  ``clear`` deletes only those, never the folder itself: a
The cache setting may point at a folder that holds other files.  Tuning results take GPU
time to make, so ``clear`` keeps them unless ``--all`` is given.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any, Iterable

from .. import config, tuning_db
from ..kernel_store import FORMAT_TAG, _MAGIC, cache_dir

_TUNING_FILES = ("tuning.json",)


def _size(paths: Iterable[Path]) -> int:
    total = 0
    for p in paths:
        try:
            total += p.stat().st_size
        except OSError:
            pass
    return total


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _files(folder: Path, pattern: str) -> list[Path]:
    try:
        return sorted(p for p in folder.glob(pattern) if p.is_file())
    except OSError:
        return []


def _entry_format(path: Path) -> int | None:
    """The format tag in an entry's header, or None for a file that is not an entry."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_MAGIC) + 4)
    except OSError:
        return None
    if len(head) < len(_MAGIC) + 4 or head[:len(_MAGIC)] != _MAGIC:
        return None
    return int.from_bytes(head[len(_MAGIC):], "little")


def _tuning_summary(path: Path) -> str:
    try:
        data = json.loads(path.read_text())
        gpus = data.get("gpus", {}) if isinstance(data, dict) else {}
        shapes = ", ".join(f"{gpu} ({len(entries)} entries)" for gpu, entries in sorted(gpus.items()))
        return shapes or "no entries"
    except (OSError, ValueError, AttributeError, TypeError):
        return "unreadable (ignored by convgen)"


def _shipped_databases() -> list[Path]:
    return _files(tuning_db.SHIPPED_DIR, "*.json")


def cache_info() -> dict[str, Any]:
    """What the cache folder holds (also the JSON of `convgen cache info --json`)."""
    root = cache_dir()
    kernels = _files(root / "kernels", "*.bin")
    formats = [_entry_format(p) for p in kernels]
    temps = _files(root / "kernels", ".*.tmp") + _files(root, ".tuning-*.tmp")
    failed = _files(root / "failed", "*")
    return {
        "location": str(root),
        "from": config.CACHE_DIR.name if config.CACHE_DIR.get() else "default",
        "exists": root.is_dir(),
        "kernels": {"entries": len(kernels), "bytes": _size(kernels),
                    "older_format": sum(f != FORMAT_TAG for f in formats)},
        "temp_files": len(temps),
        "failed_compiles": sum(not p.name.endswith(".log") for p in failed),
        "tuning": {str(p): _tuning_summary(p) for name in _TUNING_FILES if (p := root / name).is_file()},
        "shipped_tuning": {str(p): _tuning_summary(p) for p in _shipped_databases()},
    }


def cmd_info(args: argparse.Namespace) -> int:
    info = cache_info()
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return 0
    var = config.CACHE_DIR.name
    where = f"set by {var}" if info["from"] == var else f"default; {var} moves it"
    print(f"location:  {info['location']} ({where}){'' if info['exists'] else ', not created yet'}")
    k = info["kernels"]
    print(f"kernels:   {k['entries']} compiled entries, {_mb(k['bytes'])}"
          + (f" ({k['older_format']} of an older format: rebuilt when next used)" if k["older_format"] else ""))
    print(f"temp:      {info['temp_files']} temporary files (a writer's older than 5 minutes is removed by the next write)")
    print(f"failed:    {info['failed_compiles']} sources of failed compiles")
    print("tuning:    " + ("; ".join(f"{p}: {s}" for p, s in info["tuning"].items()) or "no tuning database (convgen tune writes one)"))
    for p, s in info["shipped_tuning"].items():
        print(f"shipped:   {p}: {s}")
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    root = cache_dir()
    kernels = _files(root / "kernels", "*.bin")
    temps = _files(root / "kernels", ".*.tmp") + _files(root, ".tuning-*.tmp")
    tuning = [root / name for name in _TUNING_FILES if (root / name).is_file()] if args.all else []
    nbytes = _size(kernels)
    for p in kernels + temps + tuning:
        p.unlink(missing_ok=True)
    failed = root / "failed"
    if failed.is_dir():
        shutil.rmtree(failed)
    try:
        (root / "kernels").rmdir()  # only if empty: a concurrent writer may have added one since
    except OSError:
        pass
    print(f"removed {len(kernels)} compiled kernels ({_mb(nbytes)}) from {root}"
          + (f" and {len(tuning)} tuning database(s)" if args.all else
             "; tuning databases kept (--all removes them too)"))
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("cache", help="show (info) or empty (clear) the compiled-kernel cache")
    actions = p.add_subparsers(dest="action", required=True)
    info = actions.add_parser("info", help="location, compiled entries and their size, tuning databases")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(func=cmd_info)
    clear = actions.add_parser("clear", help="delete the compiled kernels (and with --all the tuning database)")
    clear.add_argument("--all", action="store_true", help="also delete the tuning database `convgen tune` wrote")
    clear.set_defaults(func=cmd_clear)
