"""An RGB stem's 3 channels padded to 4, so a network's first layer takes the vector gathers.

Every network's stem reads an image of 3 channels. A pixel is then 6 bytes, so every main
loop gathers its activations one fp16 at a time, with the index math of each element, and
the stems trailed cuDNN most of any rows in the real-network suites (fprop 0.53-0.66x, wgrad
0.36-0.41x at cf1b940). Copying x to 4 channels, a zero after the 3 (and w the same in
fprop), gives 8-byte runs and the vector gathers, at 4/3 of the MMA work, on layers that run
far below the tensor cores' rate. The copy is one more launch and one pass over x; wgrad
computes dW at 4 channels and copies its first 3 out.

Fitted to ``benchmarks/probes/channel_pad_probe.py`` on the H200 (benchmarks/NOTES.md, 5e51afa):
padding to 4 beat padding to 8 on every stem (8/3 of the MMAs and twice the copy's writes
cost more than 16-byte runs gain over 8-byte ones); on the ImageNet-sized stems (x of 6-38 MB)
fprop ran 1.3-1.6x faster and wgrad up to 1.3x, while on CIFAR's (1.5 MB) the copy's launch
and pass cost more than the gathers saved, and at C = 1 (the speech suite) padding to 4
multiplies the work by 4 and lost 1.5-5x. Hence: C = 3, x of at least :data:`MIN_X_BYTES`.

This module holds the rule (:func:`padded_channels`: planning) and the two copy kernels
(:class:`ChannelPad`: launching, built from ``templates/copies/channel_pad.j2``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import numpy as np

from .ir import ConvProblem, Pass, Target
from .spec import Plan

PAD_TO = 4  # channels: one 8-byte run of fp16 or bf16
MIN_X_BYTES = 4 << 20  # x below this: the copy's launch and pass cost more than it saves (CIFAR)
PAD_BLOCK = 256  # threads per block of the copy kernels
GROUP = 8  # rows one pad thread copies: whole 16-byte loads and stores for any C


def padded_channels(problem: ConvProblem, pass_: Pass, in_dtype: str, target: Target,
                    plan: Optional[Plan] = None, scalar: bool = False) -> Optional[int]:
    """The channel count the convolution kernel runs on when it is not ``problem.c``, else None.

    fprop and wgrad of a 16-bit, 3-channel input of at least :data:`MIN_X_BYTES` on a CUDA
    part with cp.async (sm_80+), but not an fprop the staged halo runs as it is
    (:func:`kept_for_the_staged_halo`). Not dgrad: its output has the narrow channels (and a
    network's first layer needs no dx). Not C = 1 or 2, where padding multiplies the MMA work
    by 4 or 2 (measured only at C = 1: 1.5-5x slower), nor C = 5-7, which no suite has and no
    probe measured. Not with a hand plan or the scalar path, which name the kernel the
    caller wants; not float32 inputs, which the gathers cast on the way."""
    if not _stem(problem, pass_, in_dtype, target, plan, scalar) or _runs_staged_halo(problem, pass_, in_dtype, target):
        return None
    return PAD_TO


def _stem(problem: ConvProblem, pass_: Pass, in_dtype: str, target: Target, plan: Optional[Plan] = None,
          scalar: bool = False) -> bool:
    """A 16-bit 3-channel fprop or wgrad input of at least MIN_X_BYTES, planned, on a CUDA part with cp.async."""
    return (pass_ is not Pass.DGRAD and plan is None and not scalar and in_dtype in ("float16", "bfloat16")
            and problem.groups == 1 and target.info.backend == "cuda" and bool(target.info.cp_async)
            and problem.c == 3 and problem.n * problem.h * problem.w * problem.c * 2 >= MIN_X_BYTES)


def kept_for_the_staged_halo(problem: ConvProblem, pass_: Pass, in_dtype: str, target: Target) -> bool:
    """Whether a stem the pad would take keeps its 3 channels because the planner runs its
    fprop, unpadded, on the staged halo (a stride-1 stem; the halo rule of
    convgen/small_layer_rules.py).  That kernel copies each block's whole input
    halo into shared memory once, so 6-byte pixels no longer cost the gathers their global
    loads, and padding only adds a copy and a third more MMAs: on the three such stems padding
    ran 1.19-1.35x slower than the staged halo as is (VGG-16 conv1_1 141.0 against 117.5 us,
    UNet enc1a 59.2 / 44.6, Darknet-53's stem 213.1 / 158.0; channel_pad_probe.py on the H200
    at b41f285)."""
    return _stem(problem, pass_, in_dtype, target) and _runs_staged_halo(problem, pass_, in_dtype, target)


def _runs_staged_halo(problem: ConvProblem, pass_: Pass, in_dtype: str, target: Target) -> bool:
    from .mainloop import StagedHalo
    from .planner import plan as default_plan  # the planner never imports this module

    return pass_ is Pass.FPROP and isinstance(default_plan(problem, Pass.FPROP, target, in_dtype).loop, StagedHalo)


def kernel_problem(problem: ConvProblem, pass_: Pass, in_dtype: str, target: Target,
                   plan: Optional[Plan] = None, scalar: bool = False) -> ConvProblem:
    """The problem the convolution kernel is built for: ``problem``, or it at the padded C."""
    cp = padded_channels(problem, pass_, in_dtype, target, plan, scalar)
    return problem if cp is None else dataclasses.replace(problem, c=cp)


@functools.lru_cache(maxsize=None)
def pad_source(c: int, cp: int, out_itemsize: int) -> tuple[str, str, str]:
    """(source, pad kernel name, unpad kernel name) for rows of ``c`` channels padded to ``cp``,
    dW's elements ``out_itemsize`` bytes wide."""
    from .emit import _environment

    name = f"convgen_channels_{c}to{cp}_e{out_itemsize}"
    out_type = {2: "unsigned short", 4: "float"}[out_itemsize]
    src = _environment().get_template("copies/channel_pad.j2").render(
        name=name, c=c, cp=cp, group=GROUP, out_bytes=out_itemsize, out_type=out_type)
    return src, f"{name}_pad", f"{name}_unpad"


def _align4(elems: int) -> int:
    return -(-elems // 4) * 4  # fp32 elements, rounded to 16 bytes


class ChannelPad:
    """The copies around one padded op: x (and fprop's w) to ``cp`` channels before the
    convolution, wgrad's dW back to ``c`` after it, in scratch carved from the op's fp32
    workspace (:attr:`scratch_elems` elements, after the split-K slices). x and w must be
    16-byte aligned (the op's input checks copy a view that is not)."""

    def __init__(self, problem: ConvProblem, pass_: Pass, cp: int, out_itemsize: int) -> None:
        from .compile import load_kernels

        p = problem
        self.c, self.cp, self.pass_ = p.c, cp, pass_
        self.x_rows = p.n * p.h * p.w
        self.w_rows = p.k * p.r * p.s if pass_ is Pass.FPROP else 0
        self.dw_rows = p.k * p.r * p.s if pass_ is Pass.WGRAD else 0
        # scratch, in fp32 elements: xp (16-bit), then wp (fprop) or dwp (wgrad, out dtype)
        self._xp = _align4(self.x_rows * cp * 2 // 4)
        self._wp = _align4(self.w_rows * cp * 2 // 4)
        self._dwp = _align4(-(-self.dw_rows * cp * out_itemsize // 4))
        src, pad, unpad = pad_source(p.c, cp, out_itemsize)
        fns = load_kernels(src, (pad, unpad))
        self._pad, self._unpad = fns[pad], fns[unpad]
        groups = -(-self.x_rows // GROUP) + -(-self.w_rows // GROUP)
        self._pad_grid = (-(-groups // PAD_BLOCK), 1, 1)
        self._unpad_grid = (-(-max(self.dw_rows, 1) // PAD_BLOCK), 1, 1)
        self._rows = (np.int64(self.x_rows), np.int64(self.w_rows), np.int64(self.dw_rows))

    @property
    def scratch_elems(self) -> int:
        return self._xp + self._wp + self._dwp

    def pad(self, x: int, w: int, scratch: int, stream: Any = None) -> tuple[int, int, int]:
        """Launch the pad copy of x (and fprop's w) into ``scratch`` (a device pointer, 16-byte
        aligned); returns the pointers the convolution reads and writes instead: (xp, wp or
        w, dwp or 0)."""
        xp = scratch
        wp = scratch + 4 * self._xp if self.w_rows else 0
        dwp = scratch + 4 * (self._xp + self._wp) if self.dw_rows else 0
        u = np.uint64
        self._pad(self._pad_grid, (PAD_BLOCK, 1, 1), (u(x), u(xp), self._rows[0], u(w) if self.w_rows else u(0),
                                                      u(wp), self._rows[1]), stream=stream)
        return xp, (wp if self.w_rows else w), dwp

    def unpad(self, dwp: int, dw: int, stream: Any = None) -> None:
        """Launch the copy of the padded dW's first ``c`` channels into the caller's dW."""
        u = np.uint64
        self._unpad(self._unpad_grid, (PAD_BLOCK, 1, 1), (u(dwp), u(dw), self._rows[2]), stream=stream)
