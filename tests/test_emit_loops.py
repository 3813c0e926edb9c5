"""What each backend and main loop puts in its emitted source, read as text with no GPU: HIP's
rocWMMA-only source, cp.async only where the arch has it, the scalar gathers' row maps and the
epilogue's strip, sliced K's sums of slices, ldmatrix and stacked halo tiles, wgmma's core
matrices, and the halo tiles against a table worked out by hand.  A loop's cases may run on a
GPU only now and then, so a template edit that breaks one loop's contract must fail here first;
the cases, and the helpers that read a source, are tests/test_emit.py's."""

from __future__ import annotations

import math
import re

import pytest

from convgen.emit import emit
from convgen.resources import templates_dir
from convgen.ir import ARCHES, ConvProblem, Pass
from convgen.spec import Plan
from convgen.mainloop import TmaHalo
from convgen.planner import make_spec

from test_emit import CASES, GEMM_CASES, GEMM_IDS, code_only, constant, sources  # noqa: F401  (a fixture)


# --------------------------------------------------------------------------- backends and main loops


HIP_CASES = [(n, s) for n, s in CASES if s.target.arch in ("gfx942", "gfx1201")]


@pytest.mark.parametrize("name, spec", HIP_CASES, ids=[n for n, _ in HIP_CASES])
def test_hip_source_is_rocwmma_only(name, spec, sources):
    src = sources[name].source
    code = code_only(src)
    assert sources[name].filename.endswith(".hip")
    assert "#include <rocwmma/rocwmma.hpp>" in code and "rocwmma::" in code
    assert "#include <hip/hip_runtime.h>" in code
    for banned in ("nvcuda", "cp.async", "asm", "__syncwarp", "__cvta_generic_to_shared", "<mma.h>", "<cuda_fp16.h>"):
        assert banned not in code, banned
    assert "ASYNC = true" not in code  # every operand is register-staged on HIP
    # convgen/device.h's stubs for cp.async, and plain 16-byte stores
    assert "#define CONVGEN_CP_ASYNC 0\n#define CONVGEN_PTX_STORE16 0\n#include \"convgen/device.h\"" in code
    assert constant(src, "WARP_SIZE") == ARCHES[spec.target.arch].warp_size


@pytest.mark.parametrize("arch", ["sm_75"])
def test_cuda_without_cp_async_has_no_async_copies(arch, sources):
    checked = 0
    for name, spec in CASES:
        if spec.target.arch != arch:
            continue
        code = code_only(sources[name].source)
        # PTX only for the named barrier of the slices summed in the grid (bar.sync: every arch since sm_20)
        bare = code.replace('asm volatile("bar.sync 3, %0;\\n" ::"n"(RED_ROWS * 32) : "memory");', "")
        assert "cp.async" not in code and "__cvta_generic_to_shared" not in code and "asm" not in bare, name
        # convgen/device.h's stubs for cp.async; 16-byte stores in PTX, as on every CUDA arch
        assert "#define CONVGEN_CP_ASYNC 0\n#define CONVGEN_PTX_STORE16 1\n" in code, name
        assert "ASYNC = true" not in code, name
        assert "nvcuda::wmma" in code and "rocwmma" not in code, name
        checked += 1
    assert checked > 60


def test_cuda_with_cp_async_uses_it_for_vector_fp16_gathers(sources):
    for name, spec in GEMM_CASES:
        if spec.target.arch != "sm_90":
            continue
        code = code_only(sources[name].source)
        if spec.plan.tma:  # the copy engine moves both operands: no cp.async, no Stager
            copy = "tma_load_4d(" if isinstance(spec.plan.loop, TmaHalo) else "tma_load_im2col("  # a halo box, or im2col
            assert "cp_async(" not in code and "Stager" not in code and copy in code, name
            continue
        vector_fp16 = any(read == "float16" and vec >= 2 for read, vec in
                          ((spec.plan.read_a, spec.plan.vec_a), (spec.plan.read_b, spec.plan.vec_b)))
        assert ("ASYNC = true" in code) == vector_fp16, name
        assert "#define CONVGEN_CP_ASYNC 1\n#define CONVGEN_PTX_STORE16 1\n" in code, name  # device.h's cp.async
        assert "nvcuda::wmma" in code and "rocwmma" not in code, name


# A scalar gather of im2col (fprop/dgrad A, wgrad B) gives each thread whole rows (RowMap) when
# the threads tile the rows and the lanes sharing a row split its columns evenly; otherwise, and
# for vector gathers and w's, the per-vector TileMap.  (pass, plan, the im2col gather's map), by hand:
ROW_MAPS = [
    # 128 threads over 128 rows: one lane per row, all 32 columns
    (Pass.FPROP, Plan(128, 16, 32, 4, 1, 2, 1, 1), "RowMap<BM, BK>"),
    # 128 threads over 256 rows: two passes of 128
    (Pass.FPROP, Plan(256, 16, 32, 4, 1, 2, 1, 1), "RowMap<BM, BK>"),
    # 128 threads over 96 rows: 128 % 96 != 0
    (Pass.FPROP, Plan(96, 32, 32, 2, 2, 2, 1, 1), "TileMap<BM, BK, V>"),
    # 8 channels per access (C = 16): a vector gather
    (Pass.FPROP, Plan(128, 16, 32, 4, 1, 2, 8, 8), "TileMap<BM, BK, V>"),
    (Pass.DGRAD, Plan(128, 16, 32, 4, 1, 2, 1, 1), "RowMap<BM, BK>"),
    # wgrad's B: 64 threads over BK = 32 rows, two lanes splitting BN = 32 columns
    (Pass.WGRAD, Plan(16, 32, 32, 1, 2, 2, 8, 1), "RowMap<BK, BN>"),
    # 96 threads over 32 rows: three lanes cannot split 32 columns
    (Pass.WGRAD, Plan(48, 32, 32, 3, 1, 2, 8, 1), "TileMap<BK, BN, V>"),
]


@pytest.mark.parametrize("pass_, plan_, gather_map", ROW_MAPS, ids=[f"{p.value}-{q.brief()}" for p, q, _ in ROW_MAPS])
def test_scalar_im2col_gathers_own_whole_rows(pass_, plan_, gather_map):
    channels = 16 if plan_.vec_a == plan_.vec_b == 8 else 3
    code = code_only(emit(make_spec(ConvProblem(32, 32, channels, 16, 3, 3, 1, 1, n=2), pass_, plan_=plan_)).source)
    assert f"typedef {gather_map} Map;" in code
    assert code.count("RowMap<") == ("RowMap" in gather_map)  # used by at most one gather


@pytest.mark.parametrize("name, spec", GEMM_CASES[::2], ids=GEMM_IDS[::2])
def test_epilogue_strip_fits_the_warp_and_the_scratch(name, spec, sources):
    """DRAIN_G fragments drained side by side: a divisor of the warp's fragment columns, at most
    4 (one 128-byte fp16 row), and its scratch counted in the shared memory the launch asks for."""
    from convgen.planner import FRAG
    from convgen.footprint import EPI_PAD, drain_group

    code = sources[name].source
    g = constant(code, "DRAIN_G")
    fn = spec.plan.block_n // spec.plan.warps_n // FRAG
    assert g == drain_group(spec.plan, spec.target.warp_size)
    assert fn % g == 0 and 1 <= g <= 4
    if fn % 4 == 0 and spec.target.warp_size == 32:
        assert g == 4, "a warp 4+ fragments wide drains 128-byte rows"
    p = spec.plan
    scratch = p.warps_m * p.warps_n * FRAG * (FRAG * g + EPI_PAD) * 4  # K slice 0's warps drain
    parked = (p.warps_k - 1) * p.block_m * p.block_n * 4  # the other slices' sums, before the drain
    assert sources[name].main.shared_mem >= max(scratch, parked)


SLICED = [(n, s) for n, s in CASES if s.plan.warps_k > 1]


def test_sliced_k_kernels_add_their_slices_and_only_slice_zero_drains(sources):
    """The sliced kernels declare WARPS_K and launch every slice's warps; the others carry
    no trace of it (their source is what it was before sliced K existed)."""
    assert len(SLICED) == 9
    for name, spec in CASES:
        src = sources[name].source
        if spec.plan.warps_k == 1:
            assert "WARPS_K" not in src and "parked" not in src
            continue
        p = spec.plan
        assert constant(src, "WARPS_K") == p.warps_k
        assert sources[name].main.block[0] == p.warps_m * p.warps_n * p.warps_k * spec.target.warp_size
        assert "THREADS = WARPS_M * WARPS_N * WARPS_K * WARP_SIZE" in src
        assert "const int kk = warp_k * (BK / WARPS_K) + k0;" in src  # each slice its share of a step
        assert src.count("store_matrix_sync(parked") == 1 and src.count("load_matrix_sync(part, parked") == 1
        assert "if (warp >= WARPS_M * WARPS_N) return;" in src  # only slice 0 drains


MMA_SYNC_H = (templates_dir() / "include" / "convgen" / "mma_sync.h").read_text()


def test_narrow_halo_tiles_read_fragment_rows_through_ldmatrix(sources):
    """A halo tile narrower than a fragment (tile_w = 8): A and B come in through ldmatrix,
    the MMAs are raw m16n8k16, and no WMMA is left in the kernel; other kernels keep WMMA."""
    narrow = [(n, s) for n, s in GEMM_CASES if s.plan.tile_w % 16]
    assert len(narrow) == 7
    for name, spec in GEMM_CASES:
        src = sources[name].source
        body = src.split("namespace {", 1)[1]
        if spec.plan.tile_w % 16 == 0:
            assert "ldmatrix.sync" not in src and "convgen/mma_sync.h" not in src
            continue
        assert '#include "convgen/mma_sync.h"' in src and "ldsm_x4(" in body and "mma_16816<" in body
        assert ("ldsm_x4_trans(b[j]" in src) == (spec.pass_ is Pass.DGRAD)  # dgrad's [BK][BN] weights
        assert "wmma::" not in body
        assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in MMA_SYNC_H and "mma.sync.aligned.m16n8k16.row.col" in MMA_SYNC_H
        stacked = name.startswith("ldsm-stacked")
        assert ("pix[i] = m / TILE_W * HALO_W + m % TILE_W;" in src) != stacked
        assert ("pix[i] = img * (HALO_H1 * HALO_W) + r / TILE_W * HALO_W + r % TILE_W;" in src) == stacked


def test_stacked_halo_tiles_hold_whole_images(sources):
    """A 128- or 256-row tile 8 pixels wide over 8x8 images stacks 2 or 4 of them, each with its
    own 10x10 halo; the grid has one block per stack, the last one possibly past the batch."""
    stacked = [(n, s) for n, s in CASES if n.startswith("ldsm-stacked")]
    assert len(stacked) == 2
    for name, spec in stacked:
        imgs = spec.plan.block_m // 64
        src = sources[name]
        assert f"constexpr int IMGS = {imgs}, IMG_ROWS = TILE_H / IMGS, HALO_H1 = HALO_H / IMGS;" in src.source
        assert f"constexpr int HALO_W = 10, HALO_H = {10 * imgs}, HALO_PIX = HALO_H * HALO_W;" in src.source
        assert "img < images" in src.source  # the stack's images past the batch read as zero
        for batch in (1, 3, 4, 5, 9):
            assert src.grid(batch)[0] == -(-batch // imgs)


def test_wgmma_kernels_stage_core_matrices_and_compile_for_sm_90a(sources):
    """wgmma plans: sm_90a cubins, unpadded core-matrix stages, one m64nBNk16 instruction with
    BN/2 accumulator registers, dgrad's B transposed; the WMMA plans carry none of it."""
    wg = [(n, s) for n, s in CASES if s.plan.wgmma]
    assert len(wg) == 8
    for name, spec in CASES:
        ks, src = sources[name], sources[name].source
        if spec.plan.tma:  # wgmma too, on TMA's swizzled stages (tests/test_tma.py)
            assert ks.compile_arch == "sm_90a" and "core_at" not in src
            continue
        if not spec.plan.wgmma:
            assert ks.compile_arch == spec.target.arch and "wgmma" not in src and "core_at" not in src
            continue
        p = spec.plan
        assert ks.compile_arch == "sm_90a" and constant(src, "PAD") == 0
        assert f"wgmma.mma_async.sync.aligned.m64n{p.block_n}k16.f32.f16.f16 " in src
        regs = re.search(r"\{(%0(?:, %\d+)*)\}", src).group(1).split(", ")
        assert len(regs) == p.block_n // 2
        trans_b = 1 if spec.pass_ is Pass.DGRAD else 0
        assert f"p, 1, 1, 0, {trans_b};" in src
        assert ("core_at_n_major(Map::row(i), Map::col(i))" in src) == (spec.pass_ is Pass.DGRAD)
        assert "wmma::" not in src.split("namespace {", 1)[1]  # no WMMA fragment left in the kernel


# --------------------------------------------------------------------------- halo tiles


HALO = [(name, spec) for name, spec in GEMM_CASES if spec.plan.tile_w]
# (TILE_H, TILE_W, HALO_H, HALO_W): the tile is block_m / tile_w rows of tile_w pixels; its halo
# reaches (tile - 1) * stride + (taps - 1) * dilation + 1 input pixels each way, once per
# stacked image.  Worked out by hand:
HALO_TILES = {
    # 128 / 16 = 8 rows; 3x3 taps: 8 + 2 = 10 by 16 + 2 = 18
    "halo/N=2 8x8 64->32 3x3 stride 1,1 pad 1,1 dil 1,1/fprop/sm_90/bias-relu": (8, 16, 10, 18),
    "halo/N=2 8x8 64->32 3x3 stride 1,1 pad 1,1 dil 1,1/dgrad/sm_90/plain": (8, 16, 10, 18),
    # 128 / 32 = 4 rows; r = 3 at dilation 2: 3 + 4 + 1 = 8; s = 2 at dilation 1: 31 + 1 + 1 = 33
    "halo/N=2 20x36 16->24 3x2 stride 1,1 pad 2,0 dil 2,1/fprop/sm_90/bias-relu": (4, 32, 8, 33),
    # 64 / 16 = 4 rows; 5x5: 4 + 4 = 8 by 16 + 4 = 20
    "halo/N=2 16x16 32->64 5x5 stride 1,1 pad 2,2 dil 1,1/dgrad/sm_90/plain": (4, 16, 8, 20),
    # staged halo, stride 2, 7x7: 7 * 2 + 6 + 1 = 21 by 15 * 2 + 6 + 1 = 37
    "halo/N=1 40x44 4->16 7x7 stride 2,2 pad 3,3 dil 1,1/fprop/sm_90/staged-im2col": (8, 16, 21, 37),
    "halo-tiles/N=3 20x36 32->24 3x3 stride 1,1 pad 1,1 dil 1,1/fprop/sm_90": (16, 16, 18, 18),
    "ldsm/N=2 7x20 32->24 3x3 stride 1,1 pad 1,1 dil 1,1/fprop": (8, 8, 10, 10),
    # two 8x8 images stacked in 16 rows: two halos of 8 + 2 = 10 rows
    "ldsm-stacked/dgrad/128": (16, 8, 20, 10),
    # four: 4 * 10 = 40 rows
    "ldsm-stacked/fprop/256": (32, 8, 40, 10),
}
STACKED = {"ldsm-stacked/dgrad/128": 2, "ldsm-stacked/fprop/256": 4}  # IMGS


def test_the_halo_table_names_real_cases():
    assert set(HALO_TILES) <= {n for n, _ in HALO} and set(STACKED) <= set(HALO_TILES)


@pytest.mark.parametrize("name, spec", HALO, ids=[n for n, _ in HALO])
def test_halo_kernels_carry_the_tile_and_only_the_halo_gathers(name, spec, sources):
    """The halo constants are the plan's tile and the pixels the filter reaches from it
    (worked out here from the geometry); the im2col gathers are not emitted at all."""
    src = sources[name].source
    g = spec.geometry
    if name in HALO_TILES:
        assert tuple(constant(src, c) for c in ("TILE_H", "TILE_W", "HALO_H", "HALO_W")) == HALO_TILES[name]
        assert ("IMGS" in src) == (name in STACKED) and (name not in STACKED or constant(src, "IMGS") == STACKED[name])
    code = code_only(src)
    if spec.pass_ is Pass.FPROP and g.c % 8:  # the staged-halo im2col path: the whole input halo, then im2col
        assert "stage_input_halo(x, tile, halo)" in code and "GatherStagedX" in code
        assert "mma_tile(" in code and "mma_halo(" not in code and "struct GatherX " not in code
        assert constant(src, "HALO_HALVES") >= constant(src, "HALO_H") * constant(src, "HALO_W") * g.c
        return
    assert "mma_halo(As, Bs" in code and "mma_tile(" not in code
    assert "GatherHalo<" in code and "struct GatherX" not in code and "struct GatherDy" not in code
    # dgrad walks the filter flipped: dy pixel h + PH - r*DH for tap r
    assert ("(R - 1 - r) * DH" in code) == (spec.pass_ is Pass.DGRAD)


def test_multi_tile_halo_blocks_cover_every_tile_once():
    """A block of a tiles=4 plan computes 4 consecutive pixel tiles: the grid is the tiles
    (2 x 3 per 20x36 image at 16x16) over 4, rounded up, and the kernel loops over them."""
    name, spec = next((n, s) for n, s in CASES if n.startswith("halo-tiles/") and s.pass_ is Pass.FPROP)
    src = emit(spec)
    assert src.grid(3) == (math.ceil(3 * 2 * 3 / 4), 1, 1) and src.grid(4) == (6, 1, 1)
    code = code_only(src.source)
    assert constant(src.source, "TILES") == 4 and "halo_tiles<GatherHalo<" in code and "mainloop(" not in code.split("extern")[-1]
