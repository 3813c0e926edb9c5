"""Shared test set-up: Hypothesis profiles, the `gpu` marker, a temporary kernel cache,
and compiler warnings as errors.

The test command leaves the user's cache as it was: unless CONVGEN_CACHE_DIR is set
(CI sets a fresh one), the session compiles into a temporary folder, removed at the end.
CONVGEN_WERROR=1 (unless set otherwise) makes a kernel that NVRTC warns about fail, in
this process and in the workers and CLI processes the tests start.

CI runs the derandomized ``ci`` profile (fixed examples, no deadline) so a run is
repeatable; ``HYPOTHESIS_PROFILE=gpu-wide`` is the wide random profile for the GPU.
``HYPOTHESIS_MAX_EXAMPLES`` sets the wide profile's example count (default 400), so a
run can be fitted to the GPU time at hand.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile

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


_session_cache: str | None = None


def pytest_configure(config):
    global _session_cache
    os.environ.setdefault("CONVGEN_WERROR", "1")
    if not os.environ.get("CONVGEN_CACHE_DIR"):
        _session_cache = tempfile.mkdtemp(prefix="convgen-test-cache-")
        os.environ["CONVGEN_CACHE_DIR"] = _session_cache


def pytest_unconfigure(config):
    if _session_cache is not None:
        if os.environ.get("CONVGEN_CACHE_DIR") == _session_cache:
            del os.environ["CONVGEN_CACHE_DIR"]
        shutil.rmtree(_session_cache, ignore_errors=True)


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


@pytest.fixture
def tma_encodes(monkeypatch):
    """convgen.tma's driver replaced by one that records each tensor map it is asked for (no GPU
    needed): a list of dicts of the map's data type, base address and box (an im2col map's
    box as [channels, pixels]; a tiled map's also its dims, byte strides and swizzle)."""
    from convgen import tma

    encodes: list[dict] = []

    class Names:  # an enum class of cuda-bindings: each member is its own name
        def __getattr__(self, name):
            return name

    def answer(**kw):
        encodes.append(kw)
        return 0, type("Map", (), {"opaque": [0] * 16})()

    class FakeDriver:
        CUtensorMapDataType = CUtensorMapInterleave = CUtensorMapSwizzle = Names()
        CUtensorMapL2promotion = CUtensorMapFloatOOBfill = Names()
        cuuint64_t = cuuint32_t = staticmethod(int)

        class CUresult:
            CUDA_SUCCESS = 0

        @staticmethod
        def cuTensorMapEncodeTiled(dtype, rank, ptr, dims, strides, box, elem_strides, interleave, swizzle, *rest):
            return answer(dtype=dtype, ptr=ptr, box=list(box), dims=list(dims), strides=list(strides), swizzle=swizzle)

        @staticmethod
        def cuTensorMapEncodeIm2col(dtype, rank, ptr, dims, strides, lower, upper, channels, pixels, *rest):
            return answer(dtype=dtype, ptr=ptr, box=[channels, pixels])

    monkeypatch.setattr(tma, "_driver", lambda: FakeDriver)
    return encodes


@pytest.fixture
def one_sm(monkeypatch):
    """The runtime's target with one SM: a persistent grid of one or two blocks walks every
    tile (kernel and call caches of its own, since neither is keyed by the SM count)."""
    import cupy as cp

    import convgen.runtime as rt
    from convgen.compile import detect_target
    from convgen.ir import Target

    monkeypatch.setattr(rt, "_targets", {cp.cuda.Device().id: Target(detect_target().arch, 1)})
    monkeypatch.setattr(rt, "_cache", {})
    monkeypatch.setattr(rt, "_calls", {})


@pytest.fixture(scope="module")
def sm90_only():
    """Skips a module of Hopper kernels (sm_90a) on any other GPU, naming it."""
    from convgen.compile import detect_target

    arch = detect_target().arch
    if arch != "sm_90":
        pytest.skip(f"these kernels run on sm_90 (sm_90a) only; this GPU is {arch}")


@pytest.fixture
def fake(monkeypatch):
    """convgen.torch on the NumPy bridge (tests/torch_fake.py): its launches run the float64
    reference on the tensors' memory, behind checks of the run-time contract.  PyTorch is
    imported here, by the tests that ask for it, not by every test run."""
    from torch_fake import install

    return install(monkeypatch)


def _is_hypothesis(item) -> bool:
    return getattr(getattr(item, "obj", None), "is_hypothesis_test", False)


def pytest_collection_modifyitems(config, items):
    reason = gpu_unavailable_reason()
    if reason is None:
        # The GPU's Hypothesis tests compile a kernel or three per example and take minutes;
        # collected last (as their files order them), xdist hands them out last and the run
        # waits on their tail.  Started first, they overlap the short tests instead.  The
        # tests that time the first-use tuner's budget go last, when the other workers are
        # done compiling and the machine's CPUs are theirs (under 15 compiling workers the
        # budget's wall clock measured the contention, not the tuner).
        def rank(item) -> int:
            if "gpu" in item.keywords and _is_hypothesis(item):
                return 0
            return 2 if item.nodeid.startswith("tests/test_autotune_gpu.py") else 1

        items.sort(key=rank)
        return
    skip = pytest.mark.skip(reason=f"GPU test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
