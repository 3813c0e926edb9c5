"""Narrow groups packed into slabs, so a grouped layer runs on wide GEMMs.

A grouped layer's im2col loop is one GEMM per group (convgen/planner.py). With ResNeXt's 4 to
16 channels a group, a group's GEMM is N = 4-16 columns on a 16-column tile and a tap's
gather is 8-32 bytes: the resnext50-grouped suite ran at 0.12-0.59x cuDNN, 23-35x the bytes
floor on its 4-channel layers (benchmarks/NOTES.md, bd29e19).

Packing runs PACK neighbouring groups as one group of PACK times the channels: a slab. Its
weights are block-diagonal, each filter's CG channels at its group's place in the slab and
zeros elsewhere, so the slab's sums are exactly the groups' own: fprop's y and dgrad's dx
come out as they are, from w copied into that form first (one copy kernel, the weights
alone: KB, not the activations' MB). wgrad's kernel computes the slab's GEMM and stores each
filter's own CG channels alone, in the layer's layout (KernelSpec.pack,
``templates/parts/packed_dw.j2``): no copy follows it, and its split-K slices are 1 / PACK of
the slab's dW. The MMAs do PACK times the work on zeros, which is cheap on layers that ran
far below the tensor cores' rate; the gathers read whole 16-byte runs, and a block's N tile
is full.

This module holds the rule (:func:`packed_groups`: planning) and the weights' copy kernel
(:class:`GroupPack`: launching, built from ``templates/copies/group_pack.j2``), in the
same shape as the stems' channel pad (convgen/channel_pad.py).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import numpy as np

from .ir import ConvProblem, Pass, Target
from .spec import Plan

# Channels a slab packs groups up to. Fitted to benchmarks/probes/group_pack_probe.py on the
# H200 (benchmarks/NOTES.md, 5bf5603): slabs of 32 beat 16, 64 and 128 on every ResNeXt layer
# and pass but one, and a layer of 32 channels a group ran faster as it is than packed to 64.
SLAB = 32
# Packing every group into one slab makes a dense layer, which may run the TMA loop (sm_90):
# on g32-128-56px it ran 5.0-6.5x the slabs' rate in TFLOP/s (fprop 670 vs 133, dgrad 655 vs
# 123, wgrad 560 vs 85), so it wins where it multiplies the work by less than RATE_RATIO
# times what the slabs of SLAB do.  One layer measured: the bound is a cost model's, not a fit.
RATE_RATIO = 5
# Slabs of one 64-channel box, where the TMA loop takes grouped layers (fprop's and wgrad's
# kernels, G GEMMs side by side): that loop at twice a 32-channel slab's work beats the grouped
# im2col loop (resnext50-grouped wgrad 0.57 -> 0.93x, fprop 0.80 -> 0.85x; NOTES.md).
TMA_SLAB = 64
# A dense layer against slabs of one box, both on the TMA loop: the TFLOP/s the dense layer ran
# over the slabs' on g32-128-56px (H200; fprop 650 / 277 at a7180b7 and 78d9964, wgrad 557 / 290
# at 5bf5603 and 78d9964).  Dense wins where G is less than this times the slabs' packing.
DENSE_OVER_SLAB_RATE = {Pass.FPROP: 2.35, Pass.WGRAD: 1.92}
COPY_BLOCK = 256  # threads per block of the copy kernels


def packed_groups(problem: ConvProblem, pass_: Pass, in_dtype: str, target: Target,
                  plan: Optional[Plan] = None, scalar: bool = False) -> Optional[int]:
    """The group count the convolution kernel runs with when it is not ``problem.groups``
    (the slabs), else None.

    A grouped, not depthwise, layer on a CUDA target whose groups are narrower than
    :data:`SLAB` channels on both sides: the largest number of neighbouring groups (a divisor of
    G) whose channels fit in :data:`SLAB` on the input and the output side packs into one slab.
    Not depthwise layers, which have their own stencil loop; not with a hand plan or the scalar
    path, which name the kernel the caller wants; not on HIP, whose launcher has no copies yet.
    On a part with the TMA loop: nothing where the planner runs the layer as it is on that loop;
    else slabs of :data:`TMA_SLAB` channels where it runs those, unless the dense layer runs
    there too and its G-fold work costs less at its rate (:data:`DENSE_OVER_SLAB_RATE`); else
    every group in one slab (1: a dense layer) where the planner runs that on the TMA loop and
    G is less than :data:`RATE_RATIO` times the slabs' packing (G times the work at that loop's
    rate against PACK times at the grouped loop's)."""
    g = problem.groups
    if g == 1 or problem.depthwise or plan is not None or scalar or target.info.backend != "cuda":
        return None
    widest = max(problem.c // g, problem.k // g)

    def packing(width: int) -> int:  # the most neighbouring groups (a divisor of G) within `width` channels
        return max((d for d in range(2, g + 1) if g % d == 0 and d * widest <= width), default=1)

    pack = packing(SLAB)
    if target.info.tma:
        from .planner import plan as plan_for  # the planner never packs: no cycle at run time

        def tma(groups: int) -> bool:
            packed = dataclasses.replace(problem, groups=groups)
            return plan_for(packed, pass_, target, in_dtype).tma  # type: ignore[arg-type]

        if tma(g):  # wgrad's TMA kernel takes groups of whole 64-channel boxes as they are
            return None
        wide = packing(TMA_SLAB)
        if wide > 1 and tma(g // wide):  # slabs of one box: the TMA loop at no more than 64 / (C/G) the work
            if g < DENSE_OVER_SLAB_RATE.get(pass_, 0) * wide and tma(1):
                return 1
            return g // wide
        if g < RATE_RATIO * pack and tma(1):
            return 1
    return None if pack == 1 else g // pack


def kernel_problem(problem: ConvProblem, pass_: Pass, in_dtype: str, target: Target,
                   plan: Optional[Plan] = None, scalar: bool = False) -> ConvProblem:
    """The problem the convolution kernel is built for: ``problem``, or it with its groups
    packed into slabs."""
    groups = packed_groups(problem, pass_, in_dtype, target, plan, scalar)
    return problem if groups is None else dataclasses.replace(problem, groups=groups)


def copied_problem(problem: ConvProblem, pass_: Pass, in_dtype: str, target: Target,
                   plan: Optional[Plan] = None, scalar: bool = False) -> ConvProblem:
    """The problem the convolution kernel is built for once both copy rules have had their say:
    a stem's channels padded (convgen/channel_pad.py) or a layer's narrow groups packed (here).
    The two never meet: the pad takes ungrouped layers only."""
    from . import channel_pad

    padded = channel_pad.kernel_problem(problem, pass_, in_dtype, target, plan, scalar)
    return kernel_problem(padded, pass_, in_dtype, target, plan, scalar)


def expand_weights(w: np.ndarray, groups: int, slabs: int) -> np.ndarray:
    """NumPy's statement of what the expand kernel computes: KRSC weights of ``groups``
    groups as the block-diagonal weights of ``slabs`` slabs (documentation and CPU tests)."""
    k, r, s, cg = w.shape
    pack = groups // slabs
    out = np.zeros((k, r, s, cg * pack), dtype=w.dtype)
    for f in range(k):
        j = (f // (k // groups)) % pack  # filter f's group within its slab
        out[f, :, :, j * cg:(j + 1) * cg] = w[f]
    return out


@functools.lru_cache(maxsize=None)
def pack_source(k: int, taps: int, cg: int, kg: int, pack: int, itemsize: int) -> tuple[str, str]:
    """(source, kernel name) of the copy that expands ``k`` filters of ``taps`` taps, whose
    groups of ``cg`` channels (``kg`` filters each) pack ``pack`` to a slab, elements
    ``itemsize`` bytes wide, into the slabs' block-diagonal weights."""
    from .emit import _environment

    types = {2: "unsigned short", 4: "float"}
    name = f"convgen_group_pack_k{k}_t{taps}_cg{cg}_kg{kg}_p{pack}_e{itemsize}"
    src = _environment().get_template("copies/group_pack.j2").render(
        name=name, k=k, taps=taps, cg=cg, kg=kg, pack=pack, elem_type=types[itemsize])
    return src, f"{name}_expand"


def _align4(elems: int) -> int:
    return -(-elems // 4) * 4  # fp32 elements, rounded to 16 bytes


class GroupPack:
    """The copy before one packed fprop or dgrad: w expanded to the slabs' block-diagonal
    weights, in scratch carved from the op's fp32 workspace (:attr:`scratch_elems`
    elements). It reads and writes one element a thread: the weights are small. (wgrad
    needs none: its kernel writes each filter's own channels, KernelSpec.pack.)"""

    def __init__(self, problem: ConvProblem, slabs: int, itemsize: int) -> None:
        from .compile import load_kernels

        p = problem
        g = p.groups
        cg, kg, pack = p.c // g, p.k // g, g // slabs
        taps = p.r * p.s
        self.slab_elems = p.k * taps * cg * pack  # w's elements in the slab form
        self._scratch = _align4(-(-self.slab_elems * itemsize // 4))
        src, expand = pack_source(p.k, taps, cg, kg, pack, itemsize)
        self._expand = load_kernels(src, (expand,))[expand]
        self._grid = (-(-self.slab_elems // COPY_BLOCK), 1, 1)

    @property
    def scratch_elems(self) -> int:
        return self._scratch

    def pad(self, a: int, b: int, scratch: int, stream: Any = None) -> tuple[int, int, int]:
        """Before the convolution: w (``b``) expanded into ``scratch``. Returns what the
        convolution reads and writes instead: (a, w's slab form, 0: no dW copy after)."""
        u = np.uint64
        self._expand(self._grid, (COPY_BLOCK, 1, 1), (u(b), u(scratch)), stream=stream)
        return a, scratch, 0
