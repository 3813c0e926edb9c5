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
