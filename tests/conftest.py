"""Shared test set-up: Hypothesis profiles and the `gpu` marker.

CI runs the derandomized ``ci`` profile (fixed examples, no deadline) so a run is
repeatable; ``HYPOTHESIS_PROFILE=gpu-wide`` is the wide random profile for the GPU.
"""

from __future__ import annotations

import functools
import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=40, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "gpu-wide", derandomize=False, deadline=None, max_examples=400, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@functools.lru_cache(maxsize=None)
def gpu_unavailable_reason() -> str | None:
    """None when a CUDA GPU is usable, else why not (shown as the skip reason)."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install
        return f"cupy is not importable ({exc.__class__.__name__}: {exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"no CUDA GPU ({exc.__class__.__name__}: {exc})"
    if count < 1:
        return "no CUDA GPU (device count is 0)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = gpu_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"GPU test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
