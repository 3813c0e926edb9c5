"""What `convgen tune` and tuning on first use time on a depthwise layer besides its default:
fprop's and dgrad's chunk, run, tile and tiles a block, and wgrad's next-cheapest tiles and
slices.  Apart from convgen/depthwise.py, which plans the default, because the tuner alone
reads it (convgen/candidates.py checks these plans and drops repeats)."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Callable, Iterator

from .depthwise import (LONG_RUN_MIN_S, WGRAD_CHUNKS, chunks_by_padding, facts, long_run, resident_blocks,
                        smem_bytes, stencil_plan, stencil_registers, straddles_granules, whole_pixel_chunk)
from .depthwise_forms import held_filters, mma_eligible
from .depthwise_wgrad import plan_wgrad, row_run, summed_in_grid, wgrad_layout, wgrad_split, wgrad_tiles
from .ir import ConvProblem, DType, Pass, Target
from .mainloop import Depthwise
from .spec import Plan

# What `convgen tune` varies on a depthwise layer besides the default (fprop, dgrad): first the
# other run of the same threads (runs of 4 over 8 channels where the default is depthwise.long_run's
# runs of 8 over 4, and the reverse), then runs of 8 over 8 channels on a tile twice as tall
# (_wide_run, 5-7 wide filters: fastest on ConvNeXt's dw192-28px alone, H100), then runs of 4, 2
# or 1 outputs a thread, tiles of 4-16 rows and 8-32 columns, 1, 2 or 4 tiles a block (with 4, a
# ring of 2 or 3 halos), and the channel chunk that pads C least (48 for C = 96 or 144, where
# 64-channel chunks leave a quarter of the lanes idle), around the runs of 4.  Timed on the H200
# (e4aaee5) on both depthwise suites: the 48-channel chunk won with smaller tiles on C = 96 and
# 144 at 28-56 pixels (up to 1.22x), and runs of 4 nearly everywhere on 3x3 filters; tuning on
# first use times the first 8 (convgen/autotune.py).
VARIATION_COLS = (4, 2, 1)  # (runs of 8 over 8 channels took 121-132 registers, and one spilled)
VARIATION_TILES = ((8, 16), (4, 16), (8, 8), (16, 16), (8, 32), (4, 32), (16, 8))
VARIATION_BLOCK = (1, 2, 4)
MAX_VARIATIONS = 48


def variations(problem: ConvProblem, pass_: Pass, target: Target, base: Plan) -> Iterator[Callable[[], Plan]]:
    """Makers of the depthwise plans worth timing after ``base`` (the default), unchecked:
    fprop and dgrad vary the chunk, the run, the tile and the tiles a block, the default's
    neighbours first (fprop's held-filter plans after its nearest two: :func:`held_filters`);
    wgrad the tile search's next-cheapest tiles, each chunk's cheapest, and
    the slices around the default's.  convgen/candidates.py checks them and drops repeats."""
    if pass_ is Pass.WGRAD:
        if base.loop.out_rows > 1:  # a row-run default (depthwise_wgrad.ROW_RUN_DEFAULT): vary the plan it replaced
            base = dataclasses.replace(plan_wgrad(problem, target, base.read_a, [], row_runs=False), reasons=(
                "tuning candidate: depthwise wgrad runs of one dy row (what the row-run default replaced)",))
            yield lambda base=base: base
        for plan_ in _wgrad_variations(problem, target, base.read_a, base):
            yield lambda plan_=plan_: plan_
        return
    assert isinstance(base.loop, Depthwise)
    if base.loop.out_rows > 1:  # a held-filter default (depthwise.held_default): vary the stencil it replaced
        base = dataclasses.replace(stencil_plan(problem, pass_, target, base.read_a, []), reasons=(
            "tuning candidate: the CUDA-core stencil, one output row a thread (what the held-filter default replaced)",))
        yield lambda base=base: base
    # (CUDA only: hipcc's RDNA builds of the 5x5 ones spilled 75 VGPRs, and no AMD part has timed them)
    held = held_filters(problem, base, target) if pass_ is Pass.FPROP and target.backend == "cuda" else []
    held_makers = [lambda plan_=plan_: plan_ for plan_ in held + mma_stencils(problem, pass_, base, target)]
    base, runs = _other_runs(problem, pass_, base, target)
    for run in runs:
        yield lambda run=run: run
    warp, vec, elem, loop = target.warp_size, base.vec_a, base.read_a, base.loop
    sw = problem.stride[1]
    default = (base.block_n, loop.cols, (base.block_m // loop.tile_w, loop.tile_w), loop.tiles, base.stages)
    whole = whole_pixel_chunk(problem, vec, elem, base.block_n, target)
    options = (list(dict.fromkeys([*chunks_by_padding(problem.c, vec, 8)[:1], base.block_n,
                                   *([whole] if whole else [])])),
               [c for c in VARIATION_COLS if pass_ is not Pass.DGRAD or c % sw == 0] or [loop.cols],
               VARIATION_TILES, VARIATION_BLOCK, (2, 3))
    def threads_of(chunk: int, cols: int, tile: tuple[int, int], block: int, ring: int) -> int:
        """The block's threads, or 0 where the combination cannot run."""
        threads = tile[0] * tile[1] // cols * (chunk // vec)
        if tile[1] % cols or threads % warp or not 64 <= threads <= 512 or (ring == 3 and block < 3):
            return 0
        return threads

    # the default's neighbours first: one choice changed, then two, and so on
    combos = sorted(itertools.product(*options), key=lambda o: sum(a != b for a, b in zip(o, default)))
    nearest = None
    if whole:  # the default falls back to split pixels only where whole ones do not fit: those nearest
        # the default right after its nearest variation (the chunk that pads C least), then the
        # default with its blocks chunk first, the two ways to read the granules once
        nearest = next((o for o in combos if o[0] == whole and threads_of(*o)), None)
        if nearest is not None:
            combos.remove(nearest)
            combos.insert(2, nearest)  # combos[0] is the default itself
    interleave = dataclasses.replace(base, loop=dataclasses.replace(loop, interleave=True), reasons=(
        f"tuning candidate: the default ({base.block_n}-channel chunks) with its blocks chunk first",))
    if nearest is None and base.block_n < problem.c and straddles_granules(problem.c, elem, target):
        yield lambda: interleave  # split pixels straddle granules and no whole-pixel block fits
    neighbours = 0
    for chunk, cols, (tile_h, tile_w), block, ring in combos:
        threads = threads_of(chunk, cols, (tile_h, tile_w), block, ring)
        if not threads:
            continue
        neighbours += 1
        if neighbours == HELD_AFTER + 1:
            yield from held_makers
        yield lambda chunk=chunk, cols=cols, tile_h=tile_h, tile_w=tile_w, block=block, ring=ring, threads=threads: Plan(
            tile_h * tile_w, chunk, 16, threads // warp, 1, ring, vec, 1, elem, elem, 1, Depthwise(tile_w, cols, 0, block),
            reasons=(f"tuning candidate: depthwise {tile_h}x{tile_w} tile, {chunk} channels, runs of {cols}, "
                     f"{block} tile(s) a block" + (f", a ring of {ring} halos" if block > 1 else ""),))
        if (chunk, cols, (tile_h, tile_w), block, ring) == nearest:
            yield lambda: interleave
    if neighbours <= HELD_AFTER:
        yield from held_makers


def _other_runs(problem: ConvProblem, pass_: Pass, default: Plan, target: Target) -> tuple[Plan, list[Plan]]:
    """The default's block with runs of 4 over 8 channels (the default itself, or the block
    depthwise.long_run made it from on a wide filter), whose neighbours the tile, chunk and run
    variations are; and the other runs worth timing first, in order: the other of those two
    runs, runs of 8 over 8 channels on a taller tile, the default on its fitted tile
    (:func:`fitted_tile`), and where a whole pixel keeps the default from the long run, that run
    over the whole pixel and over a 48-channel chunk, each also on its fitted tile."""
    warp = target.warp_size
    short = dataclasses.replace(default, vec_a=8, loop=dataclasses.replace(default.loop, cols=4))
    if not (default.vec_a == 4 and long_run(problem, pass_, short) == default):
        short = default
    longer = long_run(problem, pass_, short)
    whole, narrow = _whole_pixel_long_runs(problem, pass_, short, longer, warp)

    def labelled(run: Plan, why: str) -> Plan:
        loop = run.loop
        return dataclasses.replace(run, reasons=(
            f"tuning candidate: depthwise {why} (the default's {run.block_m // loop.tile_w}x{loop.tile_w} tile, "
            f"{run.block_n} channels, {loop.tiles} tile(s) a block)",))

    long_why = "runs of 8 over 4 channels"
    runs = [labelled(short, "runs of 4 over 8 channels") if short != default else None,
            labelled(longer, long_why) if longer is not None and longer != default else None,
            _wide_run(problem, pass_, short),
            fitted_tile(problem, pass_, default, target),
            whole and labelled(whole, long_why + " over the whole pixel"),
            narrow and labelled(narrow, long_why),
            whole and fitted_tile(problem, pass_, whole, target),
            narrow and fitted_tile(problem, pass_, narrow, target)]
    return short, [r for r in runs if r is not None]


def _whole_pixel_long_runs(problem: ConvProblem, pass_: Pass, short: Plan, longer: Plan | None,
                           warp: int) -> tuple[Plan | None, Plan | None]:
    """Where the default's whole pixel is too wide for runs of 8 over 4 channels as a default
    (C = 144 and 240: 36 and 60 lanes of 4) on a filter wide enough for the long run to pay
    (depthwise.LONG_RUN_MIN_S): those runs over the whole pixel all the same (288 and 480
    threads), and over the chunk that pads C least (48).  EfficientNet-B0's 5x5 rows at those
    widths ran 0.77-0.79x cuDNN in fprop with runs of 4 (fortieth session).  Both untimed."""
    if longer is not None or problem.s < LONG_RUN_MIN_S or short.block_n < problem.c:
        return None, None
    whole = long_run(problem, pass_, short, max_lanes=None)
    if whole is not None and whole.warps_m * warp > 1024:
        whole = None
    chunk = next((c for c in chunks_by_padding(problem.c, 8, 8) if c < short.block_n), None)
    threads = short.block_m // short.loop.cols * (chunk // short.vec_a) if chunk else 0
    if not threads or threads % warp or threads < 2 * warp:
        return whole, None
    return whole, long_run(problem, pass_, dataclasses.replace(short, block_n=chunk, warps_m=threads // warp))


def _wide_run(problem: ConvProblem, pass_: Pass, base: Plan) -> Plan | None:
    """The default's threads with runs of 8 outputs over the same 8 channels, on a tile twice as
    tall: each staged column feeds 8 sums, not 4, so a 7x7 filter row converts 14 columns for 8
    outputs where the default converts 10 for 4 (12.25 conversions an output, not 17.5). A
    thread then holds 64 sums, 153-164 registers and no local memory in NVRTC 13's sm_90 SASS:
    the kind of block cuDNN's depthwise kernel runs (210 registers, 60.6 M instructions against
    the default's 86.3 M on ConvNeXt's dw96-56px; benchmarks/NOTES.md, thirty-ninth session).
    Filters of 5 columns or more, where the conversions weigh most; not yet timed.  None where
    the default is not runs of 4 over 8 channels of one filter each."""
    loop = base.loop
    assert isinstance(loop, Depthwise)
    if problem.s < 5 or long_run(problem, pass_, base, max_lanes=None) is None:  # (the same runs of 4 it doubles)
        return None
    rows = base.block_m // loop.tile_w
    return dataclasses.replace(base, block_m=2 * base.block_m, loop=dataclasses.replace(loop, cols=8), reasons=(
        f"tuning candidate: depthwise runs of 8 over 8 channels on a {2 * rows}x{loop.tile_w} tile (the default's "
        f"threads, {base.block_n} channels, {loop.tiles} tile(s) a block)",))


HELD_AFTER = 3  # tile variations before the held-filter plans: the default itself (a repeat, dropped) and its two nearest


# fprop's stencil on mma.sync (Depthwise.mma): (tile rows, tile columns, channels) a block of 4
# warps, each warp a job at a time (8 channels by two 16 x 8 output blocks; one job a warp on
# these tiles).  A 16 x 8 block of one channel's outputs is R MMAs of
# 16 staged rows by a filter row's banded Toeplitz matrix: 7 of 16 columns of B are taps on a
# 7x7 filter, so the tensor cores do the 49 multiply-adds an output in 7 MMA slots of 16,
# where the CUDA-core loops issue 49 FFMAs (benchmarks/NOTES.md, forty-fifth session).
# Timed on an H100: 0.93x the stencil's time at best (360b732, ConvNeXt's dw96-56px) and slower
# on every other row; restaged (cp.async, ldmatrix.trans, the epilogue from registers) 1.34-3.5x
# the held default's on ConvNeXt's four rows (ed9a6e2), latency- rather than shared-memory-bound
# by its byte count (benchmarks/NOTES.md, forty-seventh session).  A tuning candidate only, past
# tuning on first use's eight.  (16 x 16 pixels of 32 channels, also offered at ed9a6e2, spilled
# once jobs held 8 channels: NVRTC kept it at 128 registers.)
MMA_TILES = ((16, 32, 16), (32, 16, 16))
MMA_WARPS = 4


def mma_stencils(problem: ConvProblem, pass_: Pass, base: Plan, target: Target) -> list[Plan]:
    """The :data:`MMA_TILES` plans of the stencil on mma.sync where the layer and part take it
    (:func:`depthwise_forms.mma_eligible`), each storing 8 channels at a time and computing
    ``base``'s tiles a block; convgen/candidates.py drops those whose shared memory does not fit."""
    if mma_eligible(problem, pass_, target) is not None:
        return []
    loop = base.loop
    assert isinstance(loop, Depthwise)
    return [Plan(tile_h * tile_w, chunk, 16, MMA_WARPS, 1, 2, 8, 1, base.read_a, base.read_a, 1,
                 Depthwise(tile_w, 8, 0, loop.tiles, mma=True),
                 reasons=(f"tuning candidate: depthwise on mma.sync, each filter row a banded Toeplitz matrix "
                          f"({tile_h}x{tile_w} tile, {chunk} channels, {loop.tiles} tile(s) a block)",))
            for tile_h, tile_w, chunk in MMA_TILES]


WGRAD_NEXT_TILES = 5  # the tile search's runners-up offered to tuning


def _wgrad_variations(g: ConvProblem, target: Target, elem: DType, base: Plan) -> list[Plan]:
    """The tile search's next-cheapest tiles, each other chunk's cheapest (each with its own
    slices, summed as the default's are: in the grid on CUDA where it fits), and the default's
    tile at half and twice its slices."""
    rows, vec = wgrad_layout(g)
    out = []
    for chunk in dict.fromkeys([base.block_n, *sorted(chunks_by_padding(g.c, vec, target.warp_size, WGRAD_CHUNKS))]):
        ranked = wgrad_tiles(g, target, elem, rows, vec, chunk)
        for _, plan, cost, _ in ranked[1:1 + WGRAD_NEXT_TILES] if chunk == base.block_n else ranked[:1]:
            loop = plan.loop
            assert isinstance(loop, Depthwise)
            # with its slices summed as the default's are (in its grid on CUDA, where it fits)
            sliced = summed_in_grid(g, target, dataclasses.replace(plan, split_k=wgrad_split(g, target, plan)))
            out.append(dataclasses.replace(sliced, reasons=(
                f"tuning candidate: depthwise wgrad {plan.block_m // loop.tile_w}x{loop.tile_w} tile, {chunk} "
                f"channels, runs of {loop.cols} (modelled {cost:.0f} instructions a pixel)" + (
                    f", {sliced.split_k} slices summed in its grid" if sliced.split_reduce == "grid" else ""),)))
    if target.backend == "cuda":  # (no AMD part has timed them)
        runs = (row_run(g, target, base, cols) for cols in dict.fromkeys((base.loop.cols, base.loop.cols // 2)))
        out += [run for run in runs if run is not None]
    for split in (base.split_k // 2, base.split_k * 2):
        if 1 <= split <= 4096:  # summed in the grid only where it still is resident: at most the default's slices
            reduce = base.split_reduce if 1 < split <= base.split_k else "kernel"
            out.append(dataclasses.replace(base, split_k=split, split_reduce=reduce, reasons=(
                f"tuning candidate: the default depthwise wgrad plan in {split} slices",)))
    return out


# A tile grid of 8-multiples overhangs 28-, 14- and 7-pixel outputs (EfficientNet-B0's, MobileNetV2's
# and ConvNeXt's later stages): an 8x8 tile computes 1024 outputs of a 28x28 image to keep 784,
# and stages a halo for each of its 16 tiles, where a 4x14 tile of runs of 7 computes 784 in 14.
# Offered where the default computes at least FIT_WASTE outputs per one kept.
FIT_WASTE = 1.08


def fitted_tile(problem: ConvProblem, pass_: Pass, base: Plan, target: Target) -> Plan | None:
    """``base``'s block (its chunk, channel vector, tiles a block and ring) on the tile that
    costs its threads the fewest instructions (outputs computed inside and outside the image, a
    warp's spare lanes past the runs counted as outputs, each a multiply-add a tap and its run's
    share of the staged-column conversions), then stages the fewest halo pixels, then has the
    threads nearest ``base``'s.  Runs of ``base``'s length down to half of it (dgrad: whole
    strides), at most 16 rows and 32 columns, whole warps within 1024 threads that each have the
    registers :func:`depthwise.stencil_registers` estimates, and no fewer threads an SM's shared
    memory holds than ``base``'s (up to 2048).  None where ``base`` overhangs the output by less
    than FIT_WASTE, or no tile costs less.  The cost's weights are a model, untimed (forty-first
    session): tuning decides."""
    loop = base.loop
    assert isinstance(loop, Depthwise) and pass_ is not Pass.WGRAD
    g, warp = problem, target.warp_size
    dgrad = pass_ is Pass.DGRAD
    out_h, out_w = (g.h, g.w) if dgrad else (g.p, g.q)
    (sh, sw), lanes = (g.stride if dgrad else (1, 1)), base.block_n // base.vec_a

    def computed(tile_h: int, tile_w: int) -> int:
        return -(-out_h // tile_h) * tile_h * -(-out_w // tile_w) * tile_w

    base_h = base.block_m // loop.tile_w
    if computed(base_h, loop.tile_w) < FIT_WASTE * out_h * out_w:
        return None

    def resident(plan: Plan) -> int:  # threads an SM's shared memory holds
        return min(2048, resident_blocks(plan, g, pass_, target) * plan.warps_m * warp)

    def cost(plan: Plan, f, spare: float) -> float:
        """A thread's instructions for the image, roughly: each output computed (a spare lane
        past the runs counts as its run's) costs a multiply-add a tap of a filter row and the
        run's staged-column conversions shared among its outputs."""
        tile_h = plan.block_m // plan.loop.tile_w
        return computed(tile_h, plan.loop.tile_w) * spare * (g.s + f.in_cols / plan.loop.cols)

    base_threads, base_resident = base.warps_m * warp, resident(base)
    base_cost = cost(base, facts(base, g, pass_, warp), 1.0)
    best, best_key = None, None
    for cols in range(loop.cols, max(1, loop.cols // 2) - 1, -1):
        if cols % sw:
            continue
        for tile_w in range(cols, min(32, out_w + cols - 1) + 1, cols):
            for tile_h in range(sh, min(16, out_h + sh - 1) + 1, sh):
                if tile_w % sw or computed(tile_h, tile_w) >= computed(base_h, loop.tile_w):
                    continue
                owners = tile_h * tile_w // cols * lanes  # a thread a run and channel vector, in whole warps
                threads = -(-owners // warp) * warp
                if not 64 <= threads <= 1024:
                    continue
                plan = dataclasses.replace(base, block_m=tile_h * tile_w, warps_m=threads // warp,
                                           loop=dataclasses.replace(loop, tile_w=tile_w, cols=cols))
                f = facts(plan, g, pass_, warp)
                if stencil_registers(cols, base.vec_a, g.kg, f.in_cols) * threads > 65536:
                    continue
                if smem_bytes(plan, g, pass_, warp) > target.smem_limit or resident(plan) < base_resident:
                    continue
                work = cost(plan, f, threads / owners)
                if work >= base_cost:
                    continue
                key = (work, f.tiles_h * f.tiles_w * f.halo_h * f.halo_w, abs(threads - base_threads))
                if best_key is None or key < best_key:
                    best, best_key = plan, key
    if best is None:
        return None
    b = best.loop
    return dataclasses.replace(best, reasons=(
        f"tuning candidate: depthwise {best.block_m // b.tile_w}x{b.tile_w} tile fitted to the {out_h}x{out_w} output, "
        f"runs of {b.cols} over {best.vec_a} channels ({best.block_n} channels, {b.tiles} tile(s) a block)",))
