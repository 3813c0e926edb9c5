"""Tensor maps: the descriptors that Hopper's copy engine (TMA) reads, encoded on the host.

A TMA kernel (:class:`~convgen.mainloop.TmaWgmma`, :class:`~convgen.mainloop.TmaHalo`) takes its
``CUtensorMap`` values by value.  TmaWgmma's are the gathered activations (fprop's and
wgrad's x, dgrad's dy: one map per stride residue class) in the copy engine's im2col mode,
so it gathers the filter taps and reads zeros in the padding, and the other operand (w, or
wgrad's dy) as plain tiles; TmaHalo's are a tile's halo as one 4-D tiled box and w's taps
as tiles.  A map holds its tensor's base address, so it is encoded for
each pair of base addresses a call brings; frameworks reuse their buffers, so
:class:`TmaMaps` keeps the maps it has made, keyed by address, and a repeat call costs two
dictionary reads.

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

from .ir import ConvProblem, Pass
from .mainloop import TMA_BLOCK_K
from .residues import residue_classes

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


_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4}


def _data_type(d: Any, dtype: str) -> Any:
    """The copy engine's element type: the kernel's 16-bit type for what it reads, and y's
    dtype (float32 among them) for what it stores."""
    if dtype not in _ITEMSIZE:
        raise ValueError(f"a TMA tensor map holds float16, bfloat16 or float32, got {dtype!r}")
    t = d.CUtensorMapDataType
    return {"float16": t.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, "bfloat16": t.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            "float32": t.CU_TENSOR_MAP_DATA_TYPE_FLOAT32}[dtype]


def _im2col(ptr: int, dims: tuple[int, int, int, int], lower: tuple[int, int], upper: tuple[int, int],
            stride: tuple[int, int], block_m: int, what: str, dtype: str = "float16") -> np.void:
    """An NHWC fp16 tensor as the 4-D im2col map (channels, W, H, N), innermost first: a box
    is ``block_m`` pixels x 64 channels.  The bounding box runs from ``lower`` (W, H) to the
    far edges plus ``upper``, walked ``stride`` pixels per output pixel."""
    d = _driver()
    c, w, h, n = dims
    u64, u32 = d.cuuint64_t, d.cuuint32_t
    return _check(d.cuTensorMapEncodeIm2col(
        _data_type(d, dtype), 4, ptr,
        [u64(c), u64(w), u64(h), u64(n)], [u64(c * 2), u64(w * c * 2), u64(h * w * c * 2)],
        list(lower), list(upper), TMA_BLOCK_K, block_m, [u32(1), u32(stride[0]), u32(stride[1]), u32(1)],
        d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    ), what)


def _tiled(ptr: int, dims: tuple[int, ...], box: tuple[int, ...], what: str, dtype: str = "float16",
           swizzle: bool = True) -> np.void:
    """A dense tensor (``dims`` innermost first) as a tiled map of ``box`` boxes, 128-byte
    swizzled (or not: a store's plain rows); a box past an edge reads zeros there, and a
    store writes nothing there."""
    d = _driver()
    u64, u32 = d.cuuint64_t, d.cuuint32_t
    strides, step = [], _ITEMSIZE.get(dtype, 2)
    for extent in dims[:-1]:
        step *= extent
        strides.append(u64(step))
    return _check(d.cuTensorMapEncodeTiled(
        _data_type(d, dtype), len(dims), ptr,
        [u64(e) for e in dims], strides, [u32(b) for b in box], [u32(1)] * len(dims),
        d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B if swizzle else d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
        d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    ), what)


def im2col_map(ptr: int, problem: ConvProblem, block_m: int, dtype: str = "float16") -> np.void:
    """fprop's and wgrad's x: a box is ``block_m`` output pixels x 64 channels of one filter
    tap.  Its bounding box is where tap (0, 0) reaches over the output grid: from -padding at
    the top left to padding - (filter reach) past the bottom right, walked with the stride."""
    p = problem
    (sh, sw), (ph, pw), (dh, dw) = p.stride, p.padding, p.dilation
    return _im2col(ptr, (p.c, p.w, p.h, p.n), (-pw, -ph), (pw - (p.s - 1) * dw, ph - (p.r - 1) * dh), (sw, sh),
                   block_m, "x", dtype)


def dgrad_im2col_maps(ptr: int, problem: ConvProblem, block_m: int, dtype: str = "float16") -> np.void:
    """dgrad's dy: one map per stride residue class (convgen/residues.py), in launch order,
    as one value (the kernel's ``DyMaps``).  Class (ch, cw)'s map is fprop's map of dy under
    its flipped sub-filter, whose padding is the class's ``flip_h``, ``flip_w``: its bounding
    box walks exactly the class's hc x wc pixels.  A class no tap reaches, or with no
    pixels, is never read: its map is zeros."""
    p = problem
    maps = []
    for cls in residue_classes(p.geometry):
        if not cls.taps or not cls.pixels_per_image:
            maps.append(np.zeros(1, _MAP)[0])
            continue
        lower = (-cls.flip_w, -cls.flip_h)
        upper = (cls.wc - p.q - cls.flip_w, cls.hc - p.p - cls.flip_h)
        maps.append(_im2col(ptr, (p.k, p.q, p.p, p.n), lower, upper, (1, 1), block_m,
                            f"dy (residue class {cls.ch}, {cls.cw})", dtype))
    return np.frombuffer(b"".join(m.tobytes() for m in maps), dtype=np.dtype((np.void, 128 * len(maps))))[0]


def weight_map(ptr: int, problem: ConvProblem, block_n: int, dtype: str = "float16") -> np.void:
    """fprop's w: KRSC as a 2-D tensor [K][R*S*C]; a box is ``block_n`` filters x 64 of their
    (tap, channel) pairs, rows past K read as zeros.  Where C is not a whole number of boxes
    and the filter has several taps, w is the 3-D tensor (C, R*S, K) instead, so that a box
    past C reads zeros rather than the next tap's channels (the same bytes in shared memory)."""
    p = problem
    cg = p.c // p.groups  # a grouped layer's w is (K, R, S, C/G): [K][R*S*C/G], each group's filters in turn
    if cg % TMA_BLOCK_K and p.r * p.s > 1:
        return _tiled(ptr, (p.c, p.r * p.s, p.k), (TMA_BLOCK_K, 1, block_n), "w", dtype)
    return _tiled(ptr, (p.r * p.s * cg, p.k), (TMA_BLOCK_K, block_n), "w", dtype)


def output_map(ptr: int, problem: ConvProblem, pass_: Pass, strip_w: int, dtype: str) -> np.void:
    """The output of TmaWgmma(tma_store=True), fprop's y or a stride-1 dgrad's dx: NHWC as the
    2-D tensor [pixels][channels] of the output's dtype; a box is one warp's drained strip, 16
    pixels x ``strip_w`` channels, plain rows; the copy engine writes none of a box's pixels
    past the batch or channels past the tensor's."""
    p = problem
    if pass_ is Pass.FPROP:
        return _tiled(ptr, (p.k, p.n * p.p * p.q), (strip_w, 16), "y", dtype, swizzle=False)
    return _tiled(ptr, (p.c, p.n * p.h * p.w), (strip_w, 16), "dx", dtype, swizzle=False)


def wgrad_dy_map(ptr: int, problem: ConvProblem, dtype: str = "float16") -> np.void:
    """wgrad's dy: NHWC as a 2-D tensor [N*P*Q][K]; a box is 64 pixels x 64 filters, so a
    stage's A tile runs along M (filters), pixels past the batch and filters past K zeros."""
    p = problem
    return _tiled(ptr, (p.k, p.n * p.p * p.q), (64, TMA_BLOCK_K), "dy", dtype)


def dgrad_weight_map(ptr: int, problem: ConvProblem, dtype: str = "float16", cluster: int = 1) -> np.void:
    """dgrad's w: KRSC as a 3-D tensor (C, R*S, K); a box is 64 channels of one tap of 64
    filters, so a stage's B tile is N-major (channels along the rows), filters past K zeros.
    In clusters, a block copies 64 / ``cluster`` of a box's filters (and multicasts them)."""
    p = problem
    return _tiled(ptr, (p.c, p.r * p.s, p.k), (64, 1, TMA_BLOCK_K // cluster), "w", dtype)


def halo_map(ptr: int, problem: ConvProblem, pass_: Pass, pitch: int, dtype: str = "float16") -> np.void:
    """The TMA halo kind's activations (fprop's x, dgrad's dy), NHWC as the 4-D tiled tensor
    (channels, W, H, N): a box is a tile's halo, 64 channels x ``pitch`` columns x
    (128 / pitch + 2) rows of one image, its corner one pixel up and left of the tile's first
    output; outside the image it reads zeros (the padding)."""
    p = problem
    c, w, h = (p.c, p.w, p.h) if pass_ is Pass.FPROP else (p.k, p.q, p.p)
    return _tiled(ptr, (c, w, h, p.n), (TMA_BLOCK_K, pitch, 128 // pitch + 2, 1), "x" if pass_ is Pass.FPROP else "dy",
                  dtype)


class TmaMaps:
    """One prepared op's tensor maps of its two inputs, in the op's argument order (fprop:
    x, w; dgrad: dy, w; wgrad: x, dy), by base address (see the module's docstring).  ``dtype``:
    the kernel's 16-bit type (spec.mma_dtype), float16 or bfloat16; ``halo_pitch``: a
    TmaHalo plan's pitch (0 for the im2col TMA loop); ``cluster``: a TmaWgmma plan's blocks a
    cluster, each of which copies 1 / cluster of the weight tile (and multicasts it: fprop,
    stride-1 dgrad);
    ``store``: a TmaWgmma(tma_store=True) plan's (strip width, output dtype), whose kernel writes
    its output (fprop's y, a stride-1 dgrad's dx) through a map of its own (:meth:`out`)."""

    def __init__(self, problem: ConvProblem, pass_: Pass, block_m: int, block_n: int, dtype: str = "float16",
                 halo_pitch: int = 0, cluster: int = 1, store: tuple[int, str] | None = None) -> None:
        t = dtype
        if store is not None:
            strip_w, out_dtype = store
            self._make_out = lambda ptr: output_map(ptr, problem, pass_, strip_w, out_dtype)
        self._out: dict[int, np.void] = {}
        if halo_pitch:  # the TMA halo kind: a tile's halo a box; w as fprop's [K][R*S*C] in both passes
            self._make_a = lambda ptr: halo_map(ptr, problem, pass_, halo_pitch, t)
            self._make_b = lambda ptr: weight_map(ptr, problem, block_n, t)
        elif pass_ is Pass.FPROP:
            self._make_a = lambda ptr: im2col_map(ptr, problem, block_m, t)
            self._make_b = lambda ptr: weight_map(ptr, problem, block_n // cluster, t)
        elif pass_ is Pass.DGRAD:
            self._make_a = lambda ptr: dgrad_im2col_maps(ptr, problem, block_m, t)
            self._make_b = lambda ptr: dgrad_weight_map(ptr, problem, t, cluster)
        else:  # wgrad: A is x (64 pixels of one tap a box), B is dy
            self._make_a = lambda ptr: im2col_map(ptr, problem, TMA_BLOCK_K, t)
            self._make_b = lambda ptr: wgrad_dy_map(ptr, problem, t)
        self._a: dict[int, np.void] = {}
        self._b: dict[int, np.void] = {}

    def a(self, ptr: int) -> np.void:
        m = self._a.get(ptr)
        if m is None:
            m = self._remember(self._a, ptr, self._make_a(ptr))
        return m

    def b(self, ptr: int) -> np.void:
        m = self._b.get(ptr)
        if m is None:
            m = self._remember(self._b, ptr, self._make_b(ptr))
        return m

    def out(self, ptr: int) -> np.void:
        m = self._out.get(ptr)
        if m is None:
            m = self._remember(self._out, ptr, self._make_out(ptr))
        return m

    @staticmethod
    def _remember(cache: dict[int, np.void], ptr: int, m: np.void) -> np.void:
        if len(cache) >= _MAX_CACHED:  # a caller cycling through many buffers: start over
            cache.clear()
        cache[ptr] = m
        return m
