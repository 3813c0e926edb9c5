"""Tensor maps: the descriptors that Hopper's copy engine (TMA) reads, encoded on the host.

A :class:`~convgen.mainloop.TmaWgmma` kernel takes two ``CUtensorMap`` values by value: one
for the activations, in the copy engine's im2col mode (so it gathers the filter taps and
reads zeros in the padding), and one for the weights as plain tiles.  A map holds its
tensor's base address, so it is encoded for each pair of base addresses a call brings;
frameworks reuse their buffers, so :class:`TmaMaps` keeps the maps it has made, keyed by
address, and a repeat call costs two dictionary reads.

The encoders are the CUDA driver's ``cuTensorMapEncodeIm2col`` and
``cuTensorMapEncodeTiled``, called through NVIDIA's ``cuda-bindings`` (the ``cuda12`` and
``cuda13`` extras install the one matching CuPy's CUDA).  It is the driver API's official,
typed binding: a wrong argument raises a Python error naming it, where a hand-written
ctypes prototype of these 11- and 14-argument functions would fail silently on a mistake.
Encoding needs no GPU work and no stream; the 128 bytes go to the kernel as a NumPy void
scalar, which CuPy passes as a by-value parameter.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .ir import ConvProblem
from .mainloop import TMA_BLOCK_K

_MAP = np.dtype((np.void, 128))
_MAX_CACHED = 64  # maps kept per op and operand: a framework's buffers for one layer are a few


def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "convgen's TMA main loop encodes its tensor maps with cuda-bindings: "
            "pip install 'convgen[cuda13]' (or [cuda12]), or pip install cuda-bindings"
        ) from exc
    return driver


def _check(result: tuple, what: str) -> np.void:
    err, tmap = result
    driver = _driver()
    if err != driver.CUresult.CUDA_SUCCESS:
        name = driver.cuGetErrorName(err)[1]
        raise RuntimeError(f"{what}: the CUDA driver refused the tensor map ({name.decode() if name else err})")
    return np.array(tmap.opaque, dtype=np.uint64).view(_MAP)[0]


def im2col_map(ptr: int, problem: ConvProblem, block_m: int) -> np.void:
    """The activations' map: NHWC fp16 x as a 4-D tensor (C, W, H, N), innermost first.
    A box is ``block_m`` output pixels x 64 channels of one filter tap.  Its bounding box is
    where tap (0, 0) reaches over the output grid: from -padding at the top left to
    padding - (filter reach) past the bottom right, walked with the conv's stride."""
    d = _driver()
    p = problem
    (sh, sw), (ph, pw), (dh, dw) = p.stride, p.padding, p.dilation
    u64, u32 = d.cuuint64_t, d.cuuint32_t
    return _check(d.cuTensorMapEncodeIm2col(
        d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, ptr,
        [u64(p.c), u64(p.w), u64(p.h), u64(p.n)],
        [u64(p.c * 2), u64(p.w * p.c * 2), u64(p.h * p.w * p.c * 2)],
        [-pw, -ph], [pw - (p.s - 1) * dw, ph - (p.r - 1) * dh],
        TMA_BLOCK_K, block_m, [u32(1), u32(sw), u32(sh), u32(1)],
        d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    ), "x")


def weight_map(ptr: int, problem: ConvProblem, block_n: int) -> np.void:
    """The weights' map: KRSC fp16 w as a 2-D tensor [K][R*S*C]; a box is ``block_n``
    filters x 64 of their (tap, channel) pairs, rows past K read as zeros."""
    d = _driver()
    p = problem
    rsc = p.r * p.s * p.c
    u64, u32 = d.cuuint64_t, d.cuuint32_t
    return _check(d.cuTensorMapEncodeTiled(
        d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, ptr,
        [u64(rsc), u64(p.k)], [u64(rsc * 2)], [u32(TMA_BLOCK_K), u32(block_n)], [u32(1), u32(1)],
        d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    ), "w")


class TmaMaps:
    """One prepared fprop's tensor maps, by base address (see the module's docstring)."""

    def __init__(self, problem: ConvProblem, block_m: int, block_n: int) -> None:
        self.problem, self.block_m, self.block_n = problem, block_m, block_n
        self._x: dict[int, np.void] = {}
        self._w: dict[int, np.void] = {}

    def x(self, ptr: int) -> np.void:
        m = self._x.get(ptr)
        if m is None:
            m = self._remember(self._x, ptr, im2col_map(ptr, self.problem, self.block_m))
        return m

    def w(self, ptr: int) -> np.void:
        m = self._w.get(ptr)
        if m is None:
            m = self._remember(self._w, ptr, weight_map(ptr, self.problem, self.block_n))
        return m

    @staticmethod
    def _remember(cache: dict[int, np.void], ptr: int, m: np.void) -> np.void:
        if len(cache) >= _MAX_CACHED:  # a caller cycling through many buffers: start over
            cache.clear()
        cache[ptr] = m
        return m
