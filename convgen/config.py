"""Every ``CONVGEN_*`` setting, declared once: its name, type, default and what it changes.

Modelled on Triton's ``knobs.py``: one place a user (or a reviewer) reads to learn every
knob, and one accessor per knob so no module parses the environment itself.  Each value
is read from ``os.environ`` at the moment it is used, never cached at import, so a test's
``monkeypatch.setenv`` (or a user's ``os.environ[...] = ...`` before a call) takes effect.
An empty value counts as unset, as a shell's ``VAR= cmd`` means.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional


@dataclass(frozen=True)
class Setting:
    """One environment variable: ``get()`` is its text, or None when unset or empty."""

    name: str
    doc: str

    def get(self) -> Optional[str]:
        value = os.environ.get(self.name)
        return value if value else None


@dataclass(frozen=True)
class PathSetting(Setting):
    def path(self) -> Optional[Path]:
        value = self.get()
        return Path(value).expanduser() if value is not None else None


@dataclass(frozen=True)
class PathListSetting(Setting):
    def paths(self) -> Optional[list[Path]]:
        """The ``os.pathsep``-separated folders, or None when unset."""
        value = self.get()
        return None if value is None else [Path(p) for p in value.split(os.pathsep) if p]


@dataclass(frozen=True)
class FlagSetting(Setting):
    default: bool = True

    def enabled(self) -> bool:
        value = self.get()
        if value is None:
            return self.default
        return value.strip().lower() not in ("0", "false", "no", "off")


CACHE_DIR = PathSetting(
    "CONVGEN_CACHE_DIR",
    "compiled-kernel cache and the user's tuning database "
    "(default: $XDG_CACHE_HOME/convgen or ~/.cache/convgen)",
)
CUDA_INCLUDE = PathListSetting(
    "CONVGEN_CUDA_INCLUDE",
    "CUDA include folder(s) for NVRTC, os.pathsep-separated, taken as given "
    "(default: CUDA_HOME/CUDA_PATH, /usr/local/cuda, or the pip nvidia-* wheels)",
)
TUNED = FlagSetting(
    "CONVGEN_TUNED",
    "0 (or false/no/off) ignores the tuning databases and runs the planner's plans",
    default=True,
)
AUTOTUNE = FlagSetting(
    "CONVGEN_AUTOTUNE",
    "1 times a few candidate plans on the first call of a shape and pass that no tuning database "
    "covers, and records the fastest in the user's database (like torch.backends.cudnn.benchmark; "
    "convgen.set_autotune overrides it)",
    default=False,
)
CUOBJDUMP = PathSetting(
    "CONVGEN_CUOBJDUMP",
    "the cuobjdump `convgen sass` runs (default: cuobjdump on PATH, else the pip wheels')",
)
BENCH_COMMIT = Setting(
    "CONVGEN_BENCH_COMMIT",
    "the commit `convgen bench` names its results by, where the tree is not a git checkout",
)

WERROR = FlagSetting(
    "CONVGEN_WERROR",
    "1 makes a compiler warning on an emitted kernel an error instead of a CompilerWarning "
    "(the test suite sets it)",
    default=False,
)

# The HIP compile check's toolchain (convgen/tools/hip_isa.py; scripts/setup_hip_toolchain.sh prints all four)
HIP_PATH = PathSetting("CONVGEN_HIP_PATH", "HIP install for the HIP compile check, the folder holding "
                       "include/hip/hip_runtime.h (6.4.x)")
ROCWMMA_INCLUDE = PathSetting("CONVGEN_ROCWMMA_INCLUDE", "rocWMMA's library/include for the HIP compile check")
HIP_CLANG = Setting("CONVGEN_HIP_CLANG", "clang++ with the AMDGPU target (clang 19) for the HIP compile check")
HIP_OCKL_SHIM = PathSetting("CONVGEN_HIP_OCKL_SHIM", "a header defining the ROCm device-library functions behind "
                            "threadIdx & co. for the HIP compile check (default scripts/hip_ockl_shim.h)")

SETTINGS: tuple[Setting, ...] = (CACHE_DIR, CUDA_INCLUDE, TUNED, AUTOTUNE, CUOBJDUMP, BENCH_COMMIT, WERROR, HIP_PATH,
                                 ROCWMMA_INCLUDE, HIP_CLANG, HIP_OCKL_SHIM)


@contextlib.contextmanager
def overridden(setting: Setting, value: Optional[str]) -> Iterator[None]:
    """Set (or, with None, unset) a setting for the duration of a block, then restore it.
    It goes through the environment, so code reading it at use and child processes agree."""
    old = os.environ.get(setting.name)
    if value is None:
        os.environ.pop(setting.name, None)
    else:
        os.environ[setting.name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(setting.name, None)
        else:
            os.environ[setting.name] = old
