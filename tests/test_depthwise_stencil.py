"""The depthwise fprop and dgrad stencil without a GPU: the kernels' walk in NumPy, from the
facts the template reads and the grid the launch takes, for the tuning variations and the
whole-pixel chunk on integer data; and the halo staging, compiled by g++ and run on the host
thread by thread.  A staged read outside the halo, or a tile or channel missed or written
twice, shows here as a wrong or NaN output, on layers the GPU suite may not run."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from convgen import reference
from convgen.emit import emit
from convgen.ir import Pass
from convgen.planner import make_spec, plan
from convgen.ir import Target

from test_depthwise import dw  # a depthwise ConvProblem


def _emulate_stencil(problem, pass_, pl, rng):
    """The fprop or dgrad kernel's walk in NumPy, from the facts its template reads and the grid
    its launch takes: blocks of TILES_PB tiles per channel chunk, a zero-filled staged halo,
    runs of COLS outputs per thread whose staged reads must stay inside the halo, and stores
    guarded as the kernel guards them.  Returns (got, reference); unwritten outputs are NaN."""
    from convgen.depthwise import facts

    g, f = problem, facts(pl, problem, pass_)
    (sh, sw), (ph, pw), (dh, dl), m = g.stride, g.padding, g.dilation, g.kg
    fprop = pass_ is Pass.FPROP
    src = rng.integers(-3, 4, (g.n, g.h, g.w, g.c) if fprop else (g.n, g.p, g.q, g.k)).astype(np.float64)
    wt = rng.integers(-3, 4, g.w_shape).astype(np.float64)
    src_h, src_w, src_c = (g.h, g.w, g.c) if fprop else (g.p, g.q, g.k)
    out_h, out_w = (g.p, g.q) if fprop else (g.h, g.w)
    got = np.full((g.n, out_h, out_w, g.k if fprop else g.c), np.nan)
    grid = emit(make_spec(problem, pass_, plan_=pl)).main.grid(g.n)
    total = g.n * f.tiles_h * f.tiles_w
    assert grid[0] * f.tiles_pb >= total and grid[1] * f.chunk >= g.c, "the grid covers every tile and channel"
    wide = f.chunk * m  # staged channels a pixel (dgrad: the chunk's dy channels)
    for by, bx in np.ndindex(grid[1], grid[0]):
        if f.interleave:  # block_work's order: consecutive blocks take one group's chunks in turn
            b = by * grid[0] + bx
            by, bx = b % grid[1], b // grid[1]
        c0 = by * f.chunk
        wts = np.zeros((wide, g.r, g.s))
        k1 = min(g.k, (c0 + f.chunk) * m)
        wts[:k1 - c0 * m] = wt[c0 * m:k1, :, :, 0]
        for tile in range(bx * f.tiles_pb, min(bx * f.tiles_pb + f.tiles_pb, total)):
            n, t0, u0 = tile // (f.tiles_h * f.tiles_w), tile // f.tiles_w % f.tiles_h * f.tile_h, tile % f.tiles_w * f.tile_w
            row0, col0 = (t0 * sh - ph, u0 * sw - pw) if fprop else (t0 // sh + f.row0, u0 // sw + f.col0)
            halo = np.zeros((f.halo_h, f.halo_w, wide))
            for hy, hx in np.ndindex(f.halo_h, f.halo_w):
                iy, ix = row0 + hy, col0 + hx
                if 0 <= iy < src_h and 0 <= ix < src_w:
                    run = src[n, iy, ix, c0 * (1 if fprop else m):][:wide]
                    halo[hy, hx, :len(run)] = run
            for ty, tx in np.ndindex(f.tile_h, f.tile_w // f.cols):
                acc = np.zeros((f.cols, wide if fprop else f.chunk))
                for r in range(g.r):
                    if fprop:
                        hy = ty * sh + r * dh
                    else:
                        num = ty + ph - r * dh
                        if num % sh:
                            continue
                        hy = num // sh - f.row0
                    base = tx * f.cols * sw if fprop else tx * f.cols // sw
                    for j in range(f.in_cols):
                        assert 0 <= hy < f.halo_h and 0 <= base + j < f.halo_w, "a staged read outside the halo"
                        v = halo[hy, base + j]
                        for o, s in np.ndindex(f.cols, g.s):
                            if fprop:
                                sd = j - o * sw
                                if sd != s * dl:
                                    continue
                                acc[o] += np.repeat(v[:f.chunk], m) * wts[:, r, s]
                            else:
                                off = o + pw - s * dl
                                if off % sw or off // sw - f.col0 != j:
                                    continue
                                acc[o] += (v * wts[:, r, s]).reshape(f.chunk, m).sum(axis=1)
                oy, ox = t0 + ty, u0 + tx * f.cols
                valid = (min(g.c, c0 + f.chunk) - c0) * (m if fprop else 1)
                if oy < out_h and valid > 0:
                    for o in range(f.cols):
                        if ox + o >= out_w:
                            break
                        first = c0 * (m if fprop else 1)
                        got[n, oy, ox + o, first:first + valid] = acc[o][:valid]
    geo = dict(stride=g.stride, padding=g.padding, dilation=g.dilation, groups=g.groups)
    ref = reference.fprop(src, wt, **geo) if fprop else reference.dgrad(src, wt, (g.n, g.h, g.w, g.c), **geo)
    return got, ref


@pytest.mark.parametrize("pass_", [Pass.FPROP, Pass.DGRAD], ids=lambda p: p.value)
@pytest.mark.parametrize("problem", [dw(13, 10, 48, 3, 3, 1, 1), dw(12, 11, 144, 3, 3, 2, 1, n=1),
                                     dw(9, 20, 96, 5, 5, 1, 2), dw(10, 9, 16, 3, 3, 1, 2, 2, mult=2),
                                     dw(11, 12, 24, 7, 7, 2, 3, n=1), dw(14, 14, 64, 5, 5, 1, 2, n=1)],
                         ids=lambda p: p.describe().replace(" ", "_"))
def test_tuning_variations_emulated_are_exact(problem, pass_):
    """Every fourth of the depthwise tuning variations (chunks of 48 past C, runs of 2-8,
    several tiles a block, edge tiles), the second, the runs of 8 over 4 channels where the
    default has 8, and the tiles fitted to the output (runs of 7, tiles not whole 16-pixel
    fragments), walked as its kernel walks its layer, on integer data: each staged read lands
    inside the halo and every output equals the float64 reference."""
    from convgen.candidates import candidates

    plans = candidates(problem, pass_, Target())
    assert len(plans) > 8 and len(set(plans)) == len(plans)
    fitted = [p for p in plans if "fitted to the" in p.reasons[0]]
    if problem.h == 14:  # 8-pixel tiles overhang the 14x14 output: runs of 7 tile it exactly
        assert any(p.loop.cols == 7 and p.block_m % 16 for p in fitted), [p.brief() for p in fitted]
    # (the held-filter and mma.sync stencils walk otherwise: tests/test_depthwise_host.py runs their source)
    stencils = [p for p in plans if p.loop.out_rows == 1 and not p.loop.mma]
    for i, pl in enumerate([*stencils[::4], plans[1], *fitted]):
        got, ref = _emulate_stencil(problem, pass_, pl, np.random.default_rng(i))
        np.testing.assert_array_equal(got, ref, err_msg=pl.brief())


@pytest.mark.parametrize("pass_", [Pass.FPROP, Pass.DGRAD], ids=lambda p: p.value)
@pytest.mark.parametrize("problem", [dw(12, 11, 144, 3, 3, 2, 1, n=1), dw(13, 10, 144, 3, 3, 1, 1)],
                         ids=lambda p: p.describe().replace(" ", "_"))
def test_whole_pixel_chunk_is_the_default_where_it_fits_and_walks_exactly(problem, pass_, monkeypatch):
    """C = 144 (288-byte pixels: not whole 64-byte DRAM granules) in 64-channel chunks reads each
    granule twice, once per chunk's blocks (1.27-1.53x slower on an H100).  The default takes
    all 144 channels a block, the default's tile otherwise, and walks its layer exactly; C = 96
    (192 bytes, three granules) keeps 64-channel chunks, as C = 144 does on a GDDR part (32-byte
    granules, Arch.dram_granule), and C = 272 (34 lanes: no whole-pixel
    block) keeps them too, with tuning offering them chunk first (Depthwise.interleave) within
    tuning on first use's few, also exact."""
    from convgen.autotune import CANDIDATES
    from convgen.candidates import candidates

    plans = candidates(problem, pass_, Target())
    assert plans[0].block_n == 144 and not any(p.loop.interleave for p in plans), [p.brief() for p in plans]
    from convgen import depthwise
    with monkeypatch.context() as m:  # the tile, run and tiles a block are those of split pixels
        m.setattr(depthwise, "whole_pixel_chunk", lambda *a: None)
        split = plan(problem, pass_, Target())
    assert split.block_n == 64 and (plans[0].loop.cols, plans[0].loop.tiles) == (split.loop.cols, split.loop.tiles)
    got, ref = _emulate_stencil(problem, pass_, plans[0], np.random.default_rng(7))
    np.testing.assert_array_equal(got, ref, err_msg=plans[0].brief())
    c96 = dataclasses.replace(problem, c=96, k=96, groups=96)
    others = candidates(c96, pass_, Target())
    assert others[0].block_n == 64 and not any(p.loop.interleave for p in others)
    gddr = candidates(problem, pass_, Target("sm_86"))  # 32-byte granules: 288-byte pixels are whole ones
    assert gddr[0].block_n == 64 and not any(p.block_n == 144 or p.loop.interleave for p in gddr)
    c272 = dataclasses.replace(problem, c=272, k=272, groups=272)
    wide = candidates(c272, pass_, Target())
    inter = [i for i, p in enumerate(wide) if p.loop.interleave]
    assert wide[0].block_n == 64 and len(inter) == 1 and inter[0] < CANDIDATES, [p.brief() for p in wide]
    assert wide[inter[0]] == dataclasses.replace(wide[0], loop=dataclasses.replace(wide[0].loop, interleave=True),
                                                 reasons=wide[inter[0]].reasons)
    got, ref = _emulate_stencil(c272, pass_, wide[inter[0]], np.random.default_rng(8))
    np.testing.assert_array_equal(got, ref, err_msg=wide[inter[0]].brief())


HALO_HOST_MAIN = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#define __device__
#define __forceinline__ inline
typedef unsigned short half_t;
template <int V> struct HalfVec { struct T { half_t h[V]; }; };
template <int V> typename HalfVec<V>::T load_halves(const half_t* p) { typename HalfVec<V>::T t; std::memcpy(&t, p, sizeof t); return t; }
// cp.async with zero-fill: BYTES copied where pred, zeros where not (the source is not read then)
template <int BYTES> void cp_async(void* dst, const void* src, bool pred) {
  if (pred) std::memcpy(dst, src, BYTES); else std::memset(dst, 0, BYTES);
}
void cp_async_commit() {}
struct { unsigned x; } threadIdx;  // the host runs the block's threads one after another
constexpr int VEC = %(vec)d, HALO_VEC = VEC, THREADS = %(threads)d, HALO_H = %(hh)d, HALO_W = %(hw)d, PIX_LD = %(ld)d;
constexpr bool ASYNC_HALO = %(async)s;
%(fn)s
int main(int argc, char** argv) {
  constexpr int CH = %(ch)d, ROWS = %(rows)d, COLS_IMG = %(cols)d, CHANS = %(chans)d;
  const int row0 = std::atoi(argv[1]), col0 = std::atoi(argv[2]), ch0 = std::atoi(argv[3]);
  static half_t img[ROWS * COLS_IMG * CHANS], halo[HALO_H * HALO_W * PIX_LD];
  for (int i = 0; i < ROWS * COLS_IMG * CHANS; ++i) img[i] = static_cast<half_t>(1 + i %% 60000);
  for (half_t& h : halo) h = 0xFFFF;  // unwritten
  for (unsigned t = 0; t < THREADS; ++t) {
    threadIdx.x = t;
    stage_halo<CH, ROWS, COLS_IMG, CHANS>(halo, img, row0, col0, ch0);
  }
  for (int p = 0; p < HALO_H * HALO_W; ++p)
    for (int c = 0; c < CH; ++c) std::printf("%%d\n", halo[p * PIX_LD + c]);
}
"""


def _stage_halo_source() -> str:
    """The stage_halo function as templates/parts/depthwise.j2 writes it (no Jinja inside)."""
    from convgen.resources import templates_dir

    text = (templates_dir() / "parts" / "depthwise.j2").read_text()
    start = text.index("template <int CH, int ROWS, int COLS_IMG, int CHANS>\n__device__ __forceinline__ void stage_halo(")
    return text[start:text.index("\n}\n", start) + 3]


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="no host C++ compiler (g++) for the halo copy")
@pytest.mark.parametrize("async_", [True, False], ids=["cp.async", "registers"])
@pytest.mark.parametrize("vec, threads, hh, hw, ch, rows, cols, chans, origins", [
    (8, 128, 14, 14, 64, 20, 20, 96, [(-3, -3, 0), (10, 10, 64), (3, 9, 32)]),  # ConvNeXt's 7x7, a part chunk
    (8, 64, 10, 10, 32, 12, 12, 32, [(-1, -1, 0), (7, 3, 0)]),                 # dw32: 64 threads, 4 vectors
    (8, 128, 17, 17, 64, 30, 30, 64, [(-1, -1, 0), (15, 15, 0)]),              # stride 2: a step shorter than a row
    (8, 128, 10, 10, 96, 12, 12, 96, [(-1, 5, 0)]),                             # 12 vectors: the flat index
    (4, 128, 10, 10, 16, 9, 11, 16, [(-1, -1, 0), (2, 4, 0)]),                  # 8-byte copies
    (2, 32, 6, 9, 8, 5, 7, 8, [(-2, -3, 0), (1, 0, 0)]),                        # 4-byte copies, one warp
])
def test_halo_staging_copies_every_pixel_once_on_the_host(tmp_path, async_, vec, threads, hh, hw, ch, rows, cols,
                                                          chans, origins):
    """The depthwise halo's copies (parts/depthwise.j2's stage_halo), run on the host thread by
    thread: every halo pixel and channel holds the image's, zeros outside the image or past
    its channels, whichever path (a thread's pixels walked, or the flat index) the block's
    shape takes."""
    import subprocess

    ld = ch + 8
    src = tmp_path / "halo.cpp"
    src.write_text(HALO_HOST_MAIN % dict(vec=vec, threads=threads, hh=hh, hw=hw, ld=ld, ch=ch, rows=rows, cols=cols,
                                         chans=chans, fn=_stage_halo_source(),
                                         **{"async": "true" if async_ else "false"}))
    exe = tmp_path / "halo"
    subprocess.run(["g++", "-std=c++17", "-O1", "-o", str(exe), str(src)], check=True)
    for row0, col0, ch0 in origins:
        got = np.array(subprocess.run([str(exe), str(row0), str(col0), str(ch0)], capture_output=True, text=True,
                                      check=True).stdout.split(), dtype=np.int64).reshape(hh, hw, ch)
        y, x, c = np.meshgrid(np.arange(hh) + row0, np.arange(hw) + col0, np.arange(ch) + ch0, indexing="ij")
        inside = (y >= 0) & (y < rows) & (x >= 0) & (x < cols) & (c < chans)
        want = np.where(inside, 1 + ((y * cols + x) * chans + c) % 60000, 0)
        np.testing.assert_array_equal(got, want, err_msg=f"origin {(row0, col0, ch0)}")
