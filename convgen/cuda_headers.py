"""Where the compilers' headers are: the ``-I`` folders NVRTC needs for ``<mma.h>`` (and
hiprtc for HIP).

NVRTC has most CUDA headers built in, but not ``<mma.h>`` (WMMA), which includes
``crt/mma.h``.  With a pip-installed CUDA (no toolkit) CuPy finds no CUDA path and passes
no ``-I``, so convgen looks for one set of headers itself, of NVRTC's own CUDA major, and
never mixes two versions (see :func:`cuda_include_dirs`).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Sequence

from . import config


def _nvrtc_version() -> tuple[int, int]:
    from .compile import nvrtc_version  # read at each call: tests replace it

    return nvrtc_version()


def _not_found(message: str, log: str = "") -> Exception:
    from .compile import HeaderNotFoundError

    return HeaderNotFoundError(message, log=log) if log else HeaderNotFoundError(message)


def _site_dirs() -> list[Path]:
    seen: list[Path] = []
    for entry in sys.path:
        p = Path(entry or ".")
        if p not in seen and p.is_dir():
            seen.append(p)
    return seen


def _has_mma(inc: Path) -> bool:
    return (inc / "crt" / "mma.h").is_file()


def _with_cccl(inc: Path) -> list[str]:
    # CUDA 13 toolkits keep libcu++/CUB under include/cccl; nvcc adds it by itself, NVRTC does not.
    cccl = inc / "cccl"
    return [str(inc)] + ([str(cccl)] if cccl.is_dir() else [])


def _wheel_groups() -> list[list[Path]]:
    """Include dirs of pip-installed CUDA wheels, grouped by layout.

    CUDA 13 wheels (nvidia-cuda-runtime, -nvrtc, -crt 13.x) share one folder,
    ``site-packages/nvidia/cu13/include``; CUDA 12 wheels each have their own,
    ``nvidia/cuda_runtime/include``, ``nvidia/cuda_nvcc/include`` (which holds
    ``crt/``), ...  The groups are never mixed; the one matching NVRTC's major
    version is tried first.
    """
    by_major: dict[str, list[Path]] = {}
    legacy: list[Path] = []
    for site in _site_dirs():
        root = site / "nvidia"
        if not root.is_dir():
            continue
        for inc in sorted(root.glob("*/include")):
            name = inc.parent.name
            if re.fullmatch(r"cu\d+", name):
                by_major.setdefault(name[2:], []).append(inc)
            elif name.startswith("cuda_"):
                legacy.append(inc)
    major = str(_nvrtc_major() or "")
    groups: list[list[Path]] = []
    if major in by_major:
        groups.append(by_major.pop(major))
    if legacy and major == "12":
        groups.append(legacy)
        legacy = []
    groups.extend(by_major[k] for k in sorted(by_major, reverse=True))
    if legacy:
        groups.append(legacy)
    return groups


_HEADER_FIX = (
    "Fix one of: pip install 'convgen[cuda13]' (wheel nvidia-cuda-crt provides crt/mma.h "
    "for CUDA 13) or 'convgen[cuda12]' (nvidia-cuda-nvcc-cu12 for CUDA 12); set CUDA_HOME "
    "or CUDA_PATH to a CUDA toolkit; or set CONVGEN_CUDA_INCLUDE to the include folder(s) "
    f"('{os.pathsep}'-separated)."
)


def _header_major(dirs: Sequence[Path | str]) -> int | None:
    """The CUDA major version of a header set, from cuda.h's ``CUDA_VERSION`` (13050 -> 13)."""
    for d in dirs:
        try:
            text = (Path(d) / "cuda.h").read_text(errors="replace")
        except OSError:
            continue
        m = re.search(r"^\s*#\s*define\s+CUDA_VERSION\s+(\d+)", text, re.M)
        if m:
            return int(m.group(1)) // 1000
    return None


def _nvrtc_major() -> int | None:
    try:
        return _nvrtc_version()[0]
    except Exception:  # no CuPy / no NVRTC: headers are still reported
        return None


def cuda_include_dirs() -> list[str]:
    """The ``-I`` folders NVRTC needs for ``#include <mma.h>``: headers of NVRTC's own CUDA major.

    ``CONVGEN_CUDA_INCLUDE`` (``os.pathsep`` list) is taken as given.  Otherwise the
    sources, in order, are the toolkits at ``CUDA_HOME``, ``CUDA_PATH``,
    ``/usr/local/cuda``, then the pip wheels in ``site-packages/nvidia/*/include``;
    of those that have ``crt/mma.h``, the first whose CUDA major (cuda.h's
    ``CUDA_VERSION``) is the loaded NVRTC's wins, so a CUDA 12 toolkit in
    /usr/local/cuda does not shadow the CUDA 13 wheels NVRTC 13 came with.  A source
    of unknown major counts as a match; with no match, the first source is used.
    Only one source is used, so headers of two CUDA versions are never mixed.  Only
    existing folders are returned.  Raises :class:`HeaderNotFoundError`, listing
    every place looked at and the fix, when no source has ``crt/mma.h``.
    """
    tried: list[str] = []
    explicit = config.CUDA_INCLUDE.get()
    if explicit:
        dirs = [Path(d) for d in explicit.split(os.pathsep) if d]
        existing = [d for d in dirs if d.is_dir()]
        if any(_has_mma(d) for d in existing):
            return [str(d) for d in existing]
        raise _not_found(
            f"CONVGEN_CUDA_INCLUDE={explicit!r} has no crt/mma.h (needed by #include <mma.h>). "
            + _HEADER_FIX
        )
    found: list[list[str]] = []
    roots = [(var, os.environ.get(var)) for var in ("CUDA_HOME", "CUDA_PATH")]
    roots.append(("default", "/usr/local/cuda"))
    for label, root in roots:
        if not root:
            tried.append(f"{label}: unset")
            continue
        incs = [Path(root) / "include", *sorted(Path(root).glob("targets/*/include"))]
        inc = next((i for i in incs if _has_mma(i)), None)
        if inc is not None:
            found.append(_with_cccl(inc))
        else:
            tried.append(f"{label}={root}: no include/crt/mma.h")
    for group in _wheel_groups():
        if any(_has_mma(d) for d in group):
            found.append([str(d) for d in group])
        else:
            tried.append("wheels " + ", ".join(map(str, group)) + ": no crt/mma.h")
    if found:
        major = _nvrtc_major()
        return next((dirs for dirs in found if _header_major(dirs) in (major, None)), found[0])
    if not any("wheels" in t for t in tried):
        tried.append("pip wheels: no site-packages/nvidia/*/include")
    raise _not_found(
        "CUDA headers not found: NVRTC needs crt/mma.h for #include <mma.h>. Looked at: "
        + "; ".join(tried) + ". " + _HEADER_FIX,
        log="\n".join(tried),
    )


def hip_include_dirs() -> list[str]:
    """ROCm's include folder (from ROCM_PATH, HIP_PATH, or /opt/rocm) for hiprtc."""
    tried = []
    for var, root in (
        ("ROCM_PATH", os.environ.get("ROCM_PATH")),
        ("HIP_PATH", os.environ.get("HIP_PATH")),
        ("default", "/opt/rocm"),
    ):
        if root and (Path(root) / "include" / "hip" / "hip_runtime.h").is_file():
            return [str(Path(root) / "include")]
        tried.append(f"{var}={root or '(unset)'}")
    raise _not_found(
        "ROCm headers not found (include/hip/hip_runtime.h). Looked at: " + ", ".join(tried)
        + ". Set ROCM_PATH or HIP_PATH to the ROCm install."
    )
