"""The depthwise fprop forms beyond the CUDA-core stencil's one row a thread, both tuning
candidates (convgen/depthwise_variations.py): the held filter (Depthwise.out_rows > 1: a
thread's whole filter in registers, out_rows rows of outputs) and the stencil on mma.sync
(Depthwise.mma: each filter row a banded Toeplitz matrix).  Their limits and the one layout
fact each adds; convgen/depthwise.py plans and checks the rest as for every stencil."""

from __future__ import annotations

from .ir import ConvGeometry, ConvProblem, Pass, Target
from .mainloop import Depthwise
from .spec import Plan

# A held filter (Depthwise.out_rows > 1) keeps R x S x vec x m weights and out_rows x cols x vec x m
# sums in registers for the whole block: at most this many by held_registers' estimate, below
# sm_90's 255 with room for the addresses, so that no plan offered spills.
MAX_HELD_REGISTERS = 200


def held_registers(g: ConvGeometry, out_rows: int, cols: int, vec: int) -> int:
    """An estimate of a held-filter fprop thread's registers: its filter's weights, its sums, the
    staged column in flight and the addresses (the 24 of :func:`stencil_registers`)."""
    return 24 + g.r * g.s * vec * g.kg + out_rows * cols * vec * g.kg + vec


def held_halo_vec(c: int, chunk: int, vec: int) -> int:
    """Halves a held-filter block stages its halo with: 16-byte copies where C and the chunk
    allow them.  Its threads own narrow channel vectors (2 on a 7x7 filter, so that the filter
    fits registers), and copies that narrow would cost four times the instructions."""
    return next((v for v in (8, 4, 2) if v > vec and c % v == 0 and chunk % v == 0), vec)


def mma_eligible(g: ConvGeometry, pass_: Pass, target: Target) -> str | None:
    """Why the depthwise stencil on mma.sync (Depthwise.mma) cannot run this layer (None when it can)."""
    if pass_ is not Pass.FPROP:
        return f"it computes fprop ({pass_.value} keeps the CUDA-core stencil)"
    if g.stride != (1, 1) or g.dilation != (1, 1) or g.kg != 1:
        return (f"it needs stride 1, no dilation and one filter a channel (stride {g.stride}, dilation "
                f"{g.dilation}, {g.kg} filter(s) a channel)")
    if g.s > 9:
        return f"a filter row of S = {g.s} and 8 outputs pass its 16-column window (S <= 9)"
    if g.c % 8:
        return f"it stages 8 channels a copy: C = {g.c} is not a multiple of 8"
    if not (target.info.mma_sync and target.info.ldmatrix):
        return f"{target.arch} has no mma.sync m16n8k16 and ldmatrix (sm_80+)"
    return None


def check_mma(plan: Plan, g: ConvGeometry, pass_: Pass, target: Target) -> None:
    loop = plan.loop
    assert isinstance(loop, Depthwise)
    why = mma_eligible(g, pass_, target)
    if why:
        raise ValueError(f"Depthwise.mma: {why}")
    tile_h = plan.block_m // loop.tile_w
    if tile_h % 16 or loop.tile_w % 16 or loop.cols != 8 or loop.out_rows != 1 or plan.block_n % 8:
        raise ValueError(f"Depthwise.mma computes pairs of 16 x 8 output blocks of 8-channel staged pixels: the tile "
                         f"({tile_h}x{loop.tile_w}) must be 16-row and 16-column multiples, cols 8, out_rows 1, and "
                         f"plan.block_n={plan.block_n} a multiple of 8")
    if plan.warps_m * target.warp_size > 1024:
        raise ValueError(f"plan has {plan.warps_m * target.warp_size} threads; a block holds at most 1024")


def check_held(plan: Plan, g: ConvGeometry, pass_: Pass, threads: int) -> None:
    """Reject a held-filter plan (of ``threads`` threads, as depthwise.check counts them) that is
    not fprop or whose filter and sums would pass the register bound."""
    loop = plan.loop
    assert isinstance(loop, Depthwise)
    if pass_ is not Pass.FPROP:
        raise ValueError(f"Depthwise.out_rows={loop.out_rows} holds an fprop thread's filter in registers; "
                         f"{pass_.value} computes one row a thread (out_rows=1)")
    regs = held_registers(g, loop.out_rows, loop.cols, plan.vec_a)
    if regs > MAX_HELD_REGISTERS or regs * threads > 65536:  # (a block's registers)
        raise ValueError(f"Depthwise.out_rows={loop.out_rows}: a thread would hold {g.r}x{g.s}x{plan.vec_a}x{g.kg} "
                         f"weights and {loop.out_rows}x{loop.cols}x{plan.vec_a}x{g.kg} sums, about {regs} registers "
                         f"({threads} threads): more than {MAX_HELD_REGISTERS} a thread or the "
                         f"65,536 a block would spill; use a smaller vec_a, cols or out_rows")


def mma_stride(halves: int) -> int:
    """A stride of the stencil on mma.sync (Depthwise.mma), in halves: the fewest 16-byte units
    that hold ``halves``, made odd, so that eight 16-byte runs that far apart fall in distinct
    banks: ldmatrix's eight rows of a channel plane or of staged pixels, and the transposing
    stores into eight channels' planes."""
    units = -(-halves // 8)
    return 8 * (units if units % 2 else units + 1)


# The stencil on mma.sync's filter rows as B fragments: lane (g, t)'s register j of filter row r
# is the pair w[r][s0], w[r][s0 + 1] with s0 = 2t + 8j - g in [-7, 14] (zeros off the filter),
# kept for every s0 in shared memory as 32-bit words: one load a register.
MMA_WEIGHT_PAIRS = 22


# fprop blocks whose threads hold their channels' whole filter in registers (Depthwise.out_rows):
# (output rows, run, tile rows) a thread and block.  The present loop reads a
# filter row's weights and its staged columns from shared memory for every output row: on ConvNeXt's
# 7x7 (dw96-56px) about a byte a multiply-add, with a conversion for every four, where this one reads
# a staged value once for all the outputs and taps it feeds (benchmarks/NOTES.md, forty-fifth
# session).  All four are tuning candidates; the first is the default on 7x7 stride-1 fprop of 14
# pixels or more (depthwise.held_default: 0.84-0.85x the stencil's time there, H100).
HELD_SHAPES = ((4, 4, 8), (2, 4, 8), (4, 8, 8), (8, 4, 16))


def held_filters(problem: ConvProblem, base: Plan, target: Target) -> list[Plan]:
    """fprop plans on :data:`HELD_SHAPES` with the filter held in registers: the widest channel
    vector whose weights and sums fit :data:`depthwise_forms.MAX_HELD_REGISTERS` (2 channels on a 7x7
    filter, 4 on 5x5, 8 on 3x3 with short blocks), ``base``'s chunk and tiles a block, 8
    columns wide or wider where the chunk has few lanes; those of 64 to 512 threads.
    convgen/candidates.py checks them (registers, shared memory) and drops repeats."""
    out = []
    warp, chunk, loop = target.warp_size, base.block_n, base.loop
    assert isinstance(loop, Depthwise)
    for out_rows, cols, tile_h in HELD_SHAPES:
        vec = next((v for v in (8, 4, 2, 1) if problem.c % v == 0 and chunk % v == 0
                    and held_registers(problem, out_rows, cols, v) <= MAX_HELD_REGISTERS), 0)
        # 8 columns, or as many more as a narrow chunk needs for 64 threads (a spare lane or more
        # past the runs fills the last warp, as in the default's blocks)
        tile_w = next((w for w in (8, 16, 32) if vec and tile_h // out_rows * (w // cols) * (chunk // vec) >= 64), 0)
        warps = -(-tile_h // out_rows * (tile_w // cols) * (chunk // vec) // warp) if tile_w else 0
        if not warps or warps * warp > 512:
            continue
        out.append(Plan(tile_h * tile_w, chunk, 16, warps, 1, 2, vec, 1, base.read_a, base.read_a, 1,
                        Depthwise(tile_w, cols, 0, loop.tiles, out_rows=out_rows),
                        reasons=(f"tuning candidate: depthwise {out_rows}x{cols} outputs over {vec} channels a "
                                 f"thread, its {problem.r}x{problem.s} filter held in registers ({tile_h}x{tile_w} "
                                 f"tile, {chunk} channels, {loop.tiles} tile(s) a block)",)))
    return out
