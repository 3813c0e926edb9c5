"""convgen.compile on a GPU: what only a device can check.  Kernels load and launch (a WMMA tile
against NumPy, dynamic shared memory past the 48 KiB default), a kernel cleared from memory
loads again from disk without compiling, an unknown kernel name is refused by name, and the
target is the live device's.  Each test still has its own cache folder
(tests/test_compile.py's fixtures)."""

from __future__ import annotations

import numpy as np
import pytest

import convgen.compile as cc

from test_compile import SMEM_SRC, WMMA_SRC, _isolated, count_compiles  # noqa: F401  (two fixtures)


@pytest.mark.gpu
def test_load_and_launch_wmma():
    import cupy

    fns = cc.load_kernels(WMMA_SRC, ["wmma16"])
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 16)).astype(np.float16)
    b = rng.standard_normal((16, 16)).astype(np.float16)
    da = cupy.asarray(a)
    db_colmajor = cupy.asarray(np.ascontiguousarray(b.T))  # col-major B
    dc = cupy.zeros((16, 16), dtype=cupy.float32)
    fns["wmma16"]((1,), (32,), (da, db_colmajor, dc))
    expect = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_allclose(cupy.asnumpy(dc), expect, rtol=1e-2, atol=1e-2)
    # The second load is served from memory: the very same module.
    again = cc.load_kernels(WMMA_SRC, ["wmma16"])
    assert again["wmma16"].ptr == fns["wmma16"].ptr


@pytest.mark.gpu
def test_load_from_disk_in_fresh_memory(count_compiles):
    cc.load_kernels(WMMA_SRC, ["wmma16"])
    cc.clear_memory_cache()
    cc.load_kernels(WMMA_SRC, ["wmma16"])
    assert len(count_compiles) == 1


@pytest.mark.gpu
def test_large_dynamic_shared_memory():
    import cupy

    target = cc.detect_target()
    n = 24 * 1024  # 96 KiB of floats: above the 48 KiB default, below every sm_80+ limit
    fn = cc.load_kernels(SMEM_SRC, ["through_smem"])["through_smem"]
    cc.set_max_dynamic_shared_memory(fn, n * 4)
    x = cupy.arange(n, dtype=cupy.float32)
    y = cupy.empty_like(x)
    assert n * 4 <= target.smem_limit
    fn((1,), (256,), (x, y, np.int32(n)), shared_mem=n * 4)
    np.testing.assert_array_equal(cupy.asnumpy(y), (cupy.asnumpy(x) + 1)[::-1])


@pytest.mark.gpu
def test_unknown_kernel_name():
    with pytest.raises(KeyError, match="extern"):
        cc.load_kernels(WMMA_SRC, ["nope"])


@pytest.mark.gpu
def test_detect_target_is_live_arch():
    import cupy

    target = cc.detect_target()
    dev = cupy.cuda.Device()
    assert target.arch == "sm_" + dev.compute_capability
    assert target.sm_count == dev.attributes["MultiProcessorCount"]
    fns = cc.load_kernels(WMMA_SRC, ["wmma16"], arch=target.arch)
    assert "wmma16" in fns
