"""The TMA halo loop's planning (:class:`~convgen.mainloop.TmaHalo`): where it runs, which
pitch, and what a block occupies.  The planner asks :func:`plan_tma_halo` before the other
loops; the checker, the emitter and the candidates ask the rest, so all four agree.

The measurements behind the rules are the probe's (``benchmarks/probes/tma_halo_loop_probe.py``;
benchmarks/NOTES.md, thirty-second session, H100): on the suites' 64 -> 64 3x3 layers the loop
ran 1.13-1.20x cuDNN's fprop where a tile's positions were 80-88% outputs (56x56 and 128x128
images), 1.02x at 224x224, and 0.92x on 8x8 CIFAR images, where three in four positions
multiply padding.  A tile's cost is its 128 positions, outputs or not, so the pitch that
covers the image with the fewest tiles wins (ties: the smaller pitch, whose halo is fewer
bytes: 224x224 ran 257 us at pitch 32 against 274 at 64 and 128).  The library's kernel, which
drains through shared memory in 16-byte stores, then ran 1.14-1.41x cuDNN in fprop and dgrad on
seven such layers, 48x48 images (exactly MIN_USEFUL) among them at 1.3x (the same NOTES section).

A layer producing more than 64 channels (fprop's K, dgrad's C, a multiple of 64) runs as slices
of 64: a block holds one slice's weights and walks the tiles, so each halo is copied once per
slice.  No GPU has timed that yet, so it is a tuning candidate, offered last, not a default.
"""

from __future__ import annotations

import math

from .ir import ConvGeometry, ConvProblem, DType, Pass, Target
from .footprint import TMA_HALO_WEIGHT_BYTES, smem_bytes
from .mainloop import TMA_BLOCK_K, TMA_HALO_PITCHES, TmaHalo
from .spec import Plan

CHANNELS = 64  # reduced: one 128-byte swizzle row of fp16 a pixel; produced: one m64n64 wgmma a tap and k16, a slice
POSITIONS = 128  # a tile: two consumer warpgroups of 64
# The least share of a tile's positions that are outputs for the planner to take the loop:
# 0.80-0.875 ran 1.10-1.18x the im2col TMA loop; 0.25 (CIFAR's 8x8) ran 0.71x of it.
MIN_USEFUL = 0.75
DEFAULT_RING = 2  # halos in flight: rings of 2, 3 and 4 timed within 2% of each other


def channels(geometry: ConvGeometry, pass_: Pass) -> tuple[int, int]:
    """(reduced, produced) channels of a pass: fprop reduces C into K, dgrad K into C."""
    return (geometry.c, geometry.k) if pass_ is Pass.FPROP else (geometry.k, geometry.c)


def slices(geometry: ConvGeometry, pass_: Pass) -> int:
    """The 64-channel slices of the output a block's resident weights cover one of."""
    return channels(geometry, pass_)[1] // CHANNELS


def eligible(geometry: ConvGeometry, pass_: Pass, target: Target, in_dtype: DType = "float16") -> str | None:
    """Why the TMA halo loop cannot run this pass (None when it can)."""
    g = geometry
    if not (target.info.tma and target.info.wgmma):
        return f"needs the tensor memory accelerator and warpgroup MMAs (sm_90a), which {target.arch} does not have"
    if pass_ is Pass.WGRAD:
        return "computes fprop and dgrad (wgrad reduces over pixels, not taps)"
    if in_dtype not in ("float16", "bfloat16"):
        return "copies 16-bit inputs as they are (the copy engine cannot cast)"
    if g.groups > 1:
        return f"groups={g.groups}: its halo box holds every channel of a pixel"
    if (g.r, g.s, g.stride, g.padding, g.dilation) != (3, 3, (1, 1), (1, 1), (1, 1)):
        return ("covers 3x3 filters of stride 1, padding 1 and dilation 1 (the output grid is the input's), got "
                f"{g.r}x{g.s}, stride {g.stride}, padding {g.padding}, dilation {g.dilation}")
    reduced, produced = channels(g, pass_)
    names = ("C", "K") if pass_ is Pass.FPROP else ("K", "C")
    if reduced != CHANNELS or produced % CHANNELS:
        return (f"reduces {CHANNELS} channels (one swizzle row a pixel, the nine taps' weights resident) into a "
                f"multiple of {CHANNELS} (one m64n64 wgmma a tap, a block a slice of 64): {names[0]}={reduced}, "
                f"{names[1]}={produced}")
    return None


def tile(pitch: int) -> tuple[int, int]:
    """A tile's output rows and columns on this pitch."""
    return POSITIONS // pitch, pitch - 2


def tiles_per_image(geometry: ConvGeometry, pitch: int) -> int:
    th, tw = tile(pitch)
    return math.ceil(geometry.p / th) * math.ceil(geometry.q / tw)


def useful(geometry: ConvGeometry, pitch: int) -> float:
    """The share of a tile's positions that are outputs, over an image's tiles."""
    return geometry.p * geometry.q / (tiles_per_image(geometry, pitch) * POSITIONS)


def best_pitch(geometry: ConvGeometry) -> int:
    """The pitch with the fewest tiles an image; ties to the smaller pitch (fewer halo bytes)."""
    return min(TMA_HALO_PITCHES, key=lambda p: (tiles_per_image(geometry, p), p))


def make(pitch: int, stages: int = DEFAULT_RING, in_dtype: DType = "float16", reasons: tuple[str, ...] = ()) -> Plan:
    return Plan(POSITIONS, CHANNELS, TMA_BLOCK_K, 8, 1, stages, 8, 8, in_dtype, in_dtype, 1, loop=TmaHalo(pitch),
                reasons=reasons)


def plan_tma_halo(problem: ConvProblem, pass_: Pass, target: Target, in_dtype: DType,
                  reasons: list[str]) -> Plan | None:
    """The planner's rule: the loop, at its best pitch, wherever it runs and a tile's positions
    are at least MIN_USEFUL outputs; None otherwise (with a reason where the loop could run)."""
    if eligible(problem.geometry, pass_, target, in_dtype) is not None:
        return None
    n_slices = slices(problem.geometry, pass_)
    if n_slices > 1:
        reasons.append(f"not the TMA halo loop by default: its {n_slices} slices of 64 output channels (a block's "
                       "weights one slice, each halo copied once per slice) have not been timed on a GPU; tuning "
                       "offers it")
        return None
    pitch = best_pitch(problem.geometry)
    share = useful(problem.geometry, pitch)
    th, tw = tile(pitch)
    if share < MIN_USEFUL:
        reasons.append(f"not the TMA halo loop: {1 - share:.0%} of its best tile's positions ({th}x{tw} on pitch "
                       f"{pitch}) multiply padding, more than {1 - MIN_USEFUL:.0%} (CIFAR's 8x8 images, 75%, ran 0.71x "
                       "the im2col TMA loop)")
        return None
    why = [*reasons,
           f"TMA halo loop (sm_90a): a tile is {th}x{tw} outputs on pitch {pitch} ({share:.0%} of its 128 positions "
           f"outputs, the fewest tiles: {tiles_per_image(problem.geometry, pitch)} an image); its halo is one TMA box "
           "and each tap's A operand starts a few rows into it, so a pixel is copied about twice rather than nine times",
           f"the nine taps' weights resident ({TMA_HALO_WEIGHT_BYTES // 1024} KB), a ring of {DEFAULT_RING} halos (2-4 timed "
           "within 2%), persistent blocks, two consumer warpgroups of 64 positions"
           + ("; dgrad is this convolution of dy by the flipped filter, w read transposed (N-major B)"
              if pass_ is Pass.DGRAD else "")]
    return make(pitch, DEFAULT_RING, in_dtype, tuple(why))


def variations(problem: ConvProblem, pass_: Pass, target: Target, in_dtype: DType) -> list[Plan]:
    """The tuning candidates: every pitch, rings of 2 and 3, where they fit."""
    if eligible(problem.geometry, pass_, target, in_dtype) is not None:
        return []
    out = []
    for pitch in sorted(TMA_HALO_PITCHES, key=lambda p: (tiles_per_image(problem.geometry, p), p)):
        for stages in (2, 3):
            p = make(pitch, stages, in_dtype, (f"tuning candidate: TMA halo loop, pitch {pitch}, ring {stages}",))
            if smem_bytes(p, pass_, target.warp_size, problem.geometry) <= target.smem_limit:
                out.append(p)
    return out
