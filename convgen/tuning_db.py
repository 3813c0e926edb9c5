"""The tuning database: plans `convgen tune` measured fastest, per GPU and shape.

This is the library's side of tuning: the run-time path reads it before planning, and
`convgen tune` (in ``convgen.tools``) writes it; nothing here times or imports the tools.
Two databases are consulted, the user's first:

* the user's, ``tuning.json`` under the cache directory (``CONVGEN_CACHE_DIR``);
* the shipped ones, ``convgen/tuning/<gpu-slug>.json``, measured on our own machines.

An entry is keyed by :func:`tune_key` (geometry, pass, input dtype, arch) under the GPU's
slug; writes are atomic (:func:`convgen.fsio.atomic_write`), and a corrupt or foreign file
reads as empty, so a bad database costs speed, never correctness.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from . import config
from .fsio import atomic_write
from .ir import ConvGeometry, ConvProblem, Pass, Target
from .spec import PLAN_KEYS, Plan

DB_FORMAT = 1
SHIPPED_DIR = Path(__file__).resolve().parent / "tuning"


def gpu_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def tune_key(geometry: ConvGeometry, pass_: Pass, in_dtype: str, arch: str) -> str:
    blob = json.dumps({"g": geometry.as_dict(), "p": pass_.value, "i": in_dtype, "a": arch}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def user_db_path() -> Path:
    from .compile import cache_dir

    return cache_dir() / "tuning.json"


def shipped_db_path(gpu_name: str) -> Path:
    return SHIPPED_DIR / f"{gpu_slug(gpu_name)}.json"


def read_db(path: Path) -> dict[str, Any]:
    """The database at `path`; {} when it is missing, unreadable, corrupt or another format."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("format") == DB_FORMAT else {}


_loaded: dict[str, dict[str, Any]] = {}


def _cached(path: Path) -> dict[str, Any]:
    db = _loaded.get(str(path))
    if db is None:
        db = _loaded[str(path)] = read_db(path)
    return db


def entries_for(gpu_name: str) -> dict[str, dict[str, Any]]:
    """Every tuned entry this GPU has, the user's over the shipped ones (key -> entry)."""
    slug = gpu_slug(gpu_name)
    out: dict[str, dict[str, Any]] = {}
    for path in (shipped_db_path(gpu_name), user_db_path()):
        out.update(_cached(path).get("gpus", {}).get(slug, {}))
    return out


def has_database(gpu_name: str) -> bool:
    """Whether any database holds plans for this GPU (a tuned lookup for one that has
    none is a mistake worth reporting, not a silent fall-back to the planner)."""
    return bool(entries_for(gpu_name))


def shipped_gpus() -> list[str]:
    """The GPU slugs the shipped databases cover."""
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.json"))


# Plans pinned for one kernel shape while `convgen tune` times them (:func:`pinned`)
_pinned: dict[tuple[ConvGeometry, Pass, str], Plan] = {}


@contextlib.contextmanager
def pinned(problem: ConvProblem, pass_: Pass, in_dtype: str, plan: Plan) -> Iterator[None]:
    """While open, :func:`tuned_plan` answers ``plan`` for this kernel shape and pass, whatever
    the databases hold or CONVGEN_TUNED says.  `convgen tune` times a kernel the op builds for
    a problem other than the caller's (a grouped wgrad's slabs, which store each filter's own
    channels: KernelSpec.pack) through the op itself this way, since a hand plan names the
    caller's problem as it is.  Clearing the runtime's kernels around it is the caller's job."""
    key = (problem.geometry, pass_, in_dtype)
    _pinned[key] = plan
    try:
        yield
    finally:
        _pinned.pop(key, None)


def tuned_plan(gpu_name: str, problem: ConvProblem, pass_: Pass, in_dtype: str, target: Target) -> Optional[Plan]:
    """The plan ``convgen.conv2d`` and friends run when not given one: the tuned plan for
    this GPU and shape, unless CONVGEN_TUNED=0 asks for the planner's, or the entry is stale
    (:func:`lookup`); a plan :func:`pinned` for the shape before either.  `convgen bench`
    records its rows' plans through here, so a row names the plan that was timed."""
    if _pinned:
        pin = _pinned.get((problem.geometry, pass_, in_dtype))
        if pin is not None:
            return pin
    if not config.TUNED.enabled():
        return None
    from .planner import plan

    return lookup(gpu_name, problem.geometry, pass_, in_dtype, target.arch, batch=problem.n,
                  default=lambda: plan(problem, pass_, target, in_dtype))


def _plan_keys(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k in PLAN_KEYS}


def _default_keys(default: Optional[Callable[[], Plan]]) -> Optional[dict[str, Any]]:
    """The planner's plan as a dict; None without one, or where the planner refuses the shape
    (the tuned plan, the only one there is, then still serves)."""
    if default is None:
        return None
    try:
        return _plan_keys(default().as_dict())
    except ValueError:
        return None


def lookup(gpu_name: str, geometry: ConvGeometry, pass_: Pass, in_dtype: str, arch: str, *,
           batch: Optional[int] = None, default: Optional[Callable[[], Plan]] = None) -> Optional[Plan]:
    """The tuned plan for this shape on this GPU: the user's database first, then the shipped one.

    A tuned entry only says that its plan beat the planner's plan of its day, so it is used
    while that comparison still holds.  An entry that records the default plan it was timed
    against (``default_plan``) is stale once the planner's plan here (``default()``) differs:
    the planner has changed, or this batch plans otherwise.  An older entry without one is used
    only at the batch it was tuned at.  On the H200 the shipped ResNet-50 entries (tuned at
    batch 64, before the TMA kernels' ping-pong loops) ran ResNet-18's layers at batch 128 up to
    1.56x slower than the planner's plans, and its fprop 0.94x as fast as cuDNN instead of
    1.03x (benchmarks/NOTES.md, 2026-12-05).  Without ``batch`` and ``default`` (tools that
    list a database) every entry reads back."""
    slug = gpu_slug(gpu_name)
    key = tune_key(geometry, pass_, in_dtype, arch)
    for path in (user_db_path(), shipped_db_path(gpu_name)):
        entry = _cached(path).get("gpus", {}).get(slug, {}).get(key)
        if not entry:
            continue
        if "default_plan" in entry:
            current = _default_keys(default)
            if current is not None and _plan_keys(entry["default_plan"]) != current:
                continue
        elif batch is not None and entry.get("shape", {}).get("n") != batch:
            continue
        # The layer and pass tell Plan.from_dict which halo kind an old-style dict means.
        return Plan.from_dict(_plan_keys(entry["plan"]), geometry, pass_,
                              reasons=(f"tuned on {gpu_name}: {entry['us']:.1f} us vs "
                                       f"{entry['default_us']:.1f} us planned",))
    return None


def record(path: Path, gpu_name: str, entries: dict[str, dict[str, Any]]) -> None:
    """Merge `entries` into the database at `path` for this GPU (an atomic replace)."""
    data = read_db(path) or {"format": DB_FORMAT, "gpus": {}}
    data.setdefault("gpus", {}).setdefault(gpu_slug(gpu_name), {}).update(entries)
    atomic_write(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
    _loaded.pop(str(path), None)
