"""The shape of the kernel that sums split-K's (and stream-K's) fp32 partial outputs: block,
rows per output and outputs a thread.  Its own module because the emitter and
:mod:`convgen.stream_k` both size reductions with it, and stream_k is imported by the emitter.
"""

from __future__ import annotations

REDUCE_ROWS = 8  # rows of a reduction block; an output gets up to this many, one per slice residue
REDUCE_BLOCK = (32, REDUCE_ROWS, 1)  # 32 lanes side by side: coalesced rows of the workspace


def reduce_ways(slices: int) -> int:
    """Rows of the reduction block per output: one per slice up to REDUCE_ROWS (powers of
    two), so that a few slices leave no row idle and many keep 8 x 4 loads in flight."""
    ways = 1
    while ways * 2 <= min(slices, REDUCE_ROWS):
        ways *= 2
    return ways


def reduce_vec(n: int) -> int:
    """Outputs a reduction thread sums: 4 (one 16-byte load per slice) when runs of 4 never
    straddle a row of N and every slice stays 16-byte aligned."""
    return 4 if n % 4 == 0 else 1


def reduce_outputs_per_block(split_k: int, n: int) -> int:
    return REDUCE_BLOCK[0] * reduce_vec(n) * (REDUCE_ROWS // reduce_ways(split_k))


# Summed in the main kernel instead (plan.split_reduce "grid"), every block of the launch must be
# resident at once: a cooperative launch, whose grid-wide barrier would otherwise wait forever.
# Sizing such a grid before a kernel is compiled assumes each thread holds this many registers:
# NVRTC gave split-K wgrad kernels 40-128 on sm_90 (twenty-ninth and thirtieth sessions' `convgen
# sass` counts).  The runtime checks the real count when it loads a kernel, and falls back to the
# reduction kernel where a plan it did not get from the caller does not fit.
GRID_REDUCE_REGS = 128


def resident_split(sm_count: int, smem_limit: int, smem: int, threads: int, blocks_a_slice: int) -> int:
    """The most split-K slices whose grid (``blocks_a_slice`` blocks each) an SM count holds at
    once, at GRID_REDUCE_REGS registers a thread and ``smem`` bytes of shared memory a block (the
    SM reserves 1 KB a block)."""
    per_sm = max(1, min(smem_limit // (smem + 1024), 65536 // (threads * GRID_REDUCE_REGS)))
    return sm_count * per_sm // blocks_a_slice
