"""Shared test set-up: Hypothesis profiles and the `gpu` marker.

CI runs the derandomized ``ci`` profile (fixed examples, no deadline) so a run is
repeatable; ``HYPOTHESIS_PROFILE=gpu-wide`` is the wide random profile for the GPU.
``HYPOTHESIS_MAX_EXAMPLES`` sets the wide profile's example count (default 400), so a
run can be fitted to the GPU time at hand.
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
    "gpu-wide", derandomize=False, deadline=None, max_examples=int(os.environ.get("HYPOTHESIS_MAX_EXAMPLES", "400")),
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@functools.lru_cache(maxsize=None)
def gpu_unavailable_reason() -> str | None:
    """None when a CUDA GPU is usable, else why not (shown as the skip reason)."""
    from convgen.compile import gpu_unavailable_reason as probe

    return probe()


@pytest.fixture(scope="module")
def poison_outputs():
    """Every convgen output and workspace starts as NaN, so an element a kernel forgets
    to write fails the comparison instead of passing on leftover memory."""
    import convgen.runtime

    old = convgen.runtime.POISON_OUTPUTS
    convgen.runtime.POISON_OUTPUTS = True
    yield
    convgen.runtime.POISON_OUTPUTS = old


def pytest_collection_modifyitems(config, items):
    reason = gpu_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"GPU test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
