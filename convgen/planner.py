"""The planner: picks how one conv pass is computed on one target.

Deterministic and explainable: every choice is a small rule over the GEMM view
of the pass, and appends a one-line reason to ``Plan.reasons`` so that
``convgen plan`` can show why.  A hand-written :class:`Plan` goes through the
same feasibility check (:func:`check_plan`) as a planned one.
"""

from __future__ import annotations

import math

from .ir import ConvGeometry, ConvProblem, DType, Epilogue, Pass, Target
from .spec import KernelSpec, Plan, stages_whole_halo
from .dtypes import MMA_DTYPES, mma_dtype_for
from .limits import check_index_limits
from . import depthwise
from .mainloop import FRAG, Depthwise, FlatHalo, HaloLdsm, HaloTile, StagedHalo, TmaHalo, TmaWgmma, Wgmma, fit_tile
from .short_reduction_rules import exact_n_tile, narrow_stream_tile
from .small_layer_rules import ONE_TILE_BLOCKS_PER_SM, halo_default, split_k, wgrad_one_tile
from .footprint import gathered_channels, reduction_steps, smem_bytes, staged_halo_halves, tiles_per_block
from . import tma_halo
from .tma_plan import tma_plan
from .tma_rules import (MIN_POINTWISE_WGRAD_K, pointwise_wgrad, tma_eligible, tma_group_tile, tma_min_steps,
                        tma_short_persistent, tma_steps, tma_tail_fill)


# Tiles of 4 warps with 8 fragments each (64x128, 128x64) that spilled, and took 8 warps of 4
# to stop: wgrad whose x's im2col is gathered one channel at a time (C odd; NVRTC 13 on sm_90
# spilled 72-128 bytes a thread at C = 17, 33, 255 and K = 33 or 64; 174 registers on 8
# warps); fprop gathering x one channel at a time through registers (no cp.async: clang-19
# spilled 4-57 VGPRs on the RGB stems for gfx1100 and gfx1201); and on RDNA3, whose WMMA
# inputs are held twice, 64-deep steps staged through registers (gfx1100: 256 VGPRs and
# 262-326 spilled on 17 suite layers' wgrad, 34-48 on two dgrads; gfx1201 and gfx942 did not).
CROWDED_FRAGMENTS = 8
# Fragments a warp holds on RDNA3 (Arch.wmma_input_copies > 1) where a gather moves one channel at a time.
RDNA_SCALAR_FRAGMENTS = 4
# The narrowest gathers a 64-deep K-step takes.  A step's copies a thread grow as 64 / vec: on
# sm_90 a 128x64 tile of 4 warps gathering x 2 channels at a time (fprop, C = 226, 230, 238,
# 266) held 255 registers and made 110-158 local-memory accesses, and 128x128 tiles of 8 warps
# sat at 255 (a bf16 dgrad of K = 254 spilled); 4 channels at a time held 248-253, 8 held 128
# (scripts/compile_fuzz.py, then a sweep of C x K x filter; benchmarks/NOTES.md).  Narrower
# gathers keep the 32-deep step, as one-channel gathers always have.
WIDE_STEP_VEC = 4
# The most one-channel (register-staged) wgrad accesses a thread and K-step that a block of 4 warps
# keeps; past it the block takes 8: 40 spilled, 32 (x alone, dy in 16-byte copies: the speech
# stems) held 168-196.
REGISTER_GATHER_ACCESSES = 32


def vector_width(channels: int) -> int:
    """The widest access (elements of 8, 4, 2 or 1) that a run of this many channels allows."""
    for v in (8, 4, 2):
        if channels % v == 0:
            return v
    return 1


def _warp_grid(bm: int, bn: int, warps: int) -> tuple[int, int]:
    """Split `warps` over the block so each warp tile is as square as it can be (more reuse
    per fragment load), ties going to taller tiles; falls back to fewer warps when the
    block is too small to give each warp a fragment."""
    while warps > 1:
        options = [
            (wm, warps // wm)
            for wm in range(1, warps + 1)
            if warps % wm == 0 and bm % (FRAG * wm) == 0 and bn % (FRAG * (warps // wm)) == 0
        ]
        if options:
            return min(options, key=lambda o: (abs(math.log2((bm / o[0]) / (bn / o[1]))), o[1]))
        warps //= 2
    return (1, 1)


def plan(
    problem: ConvProblem,
    pass_: Pass | str,
    target: Target | None = None,
    in_dtype: DType = "float16",
    *,
    scalar: bool = False,
    mma_dtype: DType | None = None,
) -> Plan:
    """Choose a plan for ``problem`` (its batch size only sizes split-K and tiles).

    ``scalar=True`` renders the scalar staging path whatever the channel counts,
    so tests can compare it with the vector path on the same shape.  ``mma_dtype``: the
    MMA's 16-bit type (:mod:`convgen.dtypes`; None: in_dtype's); a target without it is refused.
    """
    pass_ = Pass.parse(pass_)
    target = target or Target()
    elem = mma_dtype_for(in_dtype, mma_dtype, target)
    gemm = problem.group_gemm(pass_)  # one group's: the GEMM a block tiles
    reasons: list[str] = [
        f"GEMM M={gemm.m} ({gemm.m_axis}) x N={gemm.n} ({gemm.n_axis}) x K={gemm.k} ({gemm.k_axis})"
        + (f", {problem.groups} of them side by side (one per group)" if problem.groups > 1 else "")
    ]
    if problem.depthwise:  # convgen/depthwise.py: a stencil, not a GEMM
        final = _replace(depthwise.plan_depthwise(problem, pass_, target, elem, reasons), reasons=tuple(reasons))
        check_plan(final, problem, pass_, target, in_dtype, mma_dtype=elem)
        return final
    if problem.groups > 1:
        reasons.append(f"groups={problem.groups}: one GEMM per group, side by side along the grid's y "
                       "(groups x N tiles)")

    halo_box = None if scalar else tma_halo.plan_tma_halo(problem, pass_, target, in_dtype, reasons)
    if halo_box is not None:  # 64-channel 3x3 stride-1 layers on sm_90a (convgen/tma_halo.py)
        check_plan(halo_box, problem, pass_, target, in_dtype, mma_dtype=elem)
        return halo_box
    if not scalar:
        why = tma_eligible(problem.geometry, pass_, target, in_dtype)
        # a block's K-steps (strided dgrad's heaviest residue class), read only where the loop runs
        steps = tma_steps(problem, pass_) if why is None else 0
        least, evidence = tma_min_steps(problem, pass_)
        if why is None and pass_ is Pass.WGRAD:
            if not pointwise_wgrad(problem, pass_) and gemm.m < 64:
                why = f"K={gemm.m} filters fill less than one 64-row consumer warpgroup"
            elif gemm.m < MIN_POINTWISE_WGRAD_K:
                why = (f"K={gemm.m} filters fill less than half a 64-row consumer warpgroup (a 1x1 layer's K = 24 "
                       "lost to the im2col loop, 32 and 40 won: tma_rules.POINTWISE_WGRAD_ROWS)")
        why = why or tma_tail_fill(problem, pass_)
        # A short reduction, or a 1x1 layer's long one, may take the persistent tile the roofline picks
        pointwise = problem.r * problem.s == 1 and pass_ is not Pass.WGRAD
        short, short_why = (tma_short_persistent(problem, pass_, target, steps)
                            if why is None and (steps < least or pointwise) else (None, ""))
        if why is None and (pass_ is Pass.WGRAD or steps >= least and gemm.n >= 64 or short is not None):
            if short is not None and steps < least:
                reasons.append(f"{steps} K-step(s), fewer than the TMA loop's {least}, through its persistent kernel: "
                               f"measured faster on such {'strided 3x3' if problem.stride != (1, 1) else '1x1'} layers "
                               "(tma_rules.tma_short_persistent)")
            return _replace(tma_plan(problem, pass_, target, reasons, steps, short_tile=short, short_why=short_why,
                                     short_first=steps < least),
                            read_a=elem, read_b=elem)
        if why is None or target.info.tma:  # on other targets the TMA loop is not a candidate worth naming
            reasons.append("not the TMA main loop: " + (
                why if why is not None else
                f"{steps} K-step(s) of 64 channels, fewer than {least}; its ring's fill and its epilogue would "
                f"not be amortised ({evidence}), and not its persistent kernel: {short_why}" if steps < least else
                f"N={gemm.n} is narrower than its narrowest tile (64)"))

    bn = fit_tile(gemm.n, 128)
    padding = 1 - gemm.n / (math.ceil(gemm.n / bn) * bn)
    reasons.append(f"block N {bn}: the smallest power-of-two tile of fragments covering N={gemm.n} (cap 128)"
                   + (f"; {padding:.0%} of the tiles' columns are padding" if padding >= 0.005 else ""))
    if pass_ is Pass.WGRAD:
        bm = fit_tile(gemm.m, 128)
        reasons.append(f"block M {bm}: covers wgrad's M=K={gemm.m} (cap 128)")
    else:
        bm = 128
    ca, cb = gathered_channels(problem, pass_)
    if scalar:
        va = vb = 1
    else:
        va, vb = vector_width(ca), vector_width(cb)
    # The deep-step tile only as it was measured: cp.async's ring of 3 stages (on sm_75 the stages
    # go through registers), in this target's shared memory.
    narrow = None if scalar or not target.info.cp_async else narrow_stream_tile(problem, pass_)
    if narrow is not None and smem_bytes(Plan(narrow[0], bn, narrow[1], 4, 1, 3, va, vb), pass_,
                                         target.warp_size) > target.smem_limit:
        narrow = None
    if narrow is not None:
        bm = narrow[0]
        reasons.append(f"block M {bm}, K-step {narrow[1]}: {narrow[2]}")
    elif pass_ is not Pass.WGRAD:
        reasons.append(f"block M 128: M={gemm.m} pixels is the long axis")
    big_k = gemm.k >= 1024 and min(va, vb) >= WIDE_STEP_VEC
    # a wgrad whose dy is one fragment of scalar rows (K < 8 filters: a 1x1 head) gathers a few
    # values a step whatever its depth; x's vector rows are the stream, and a 64-deep step puts
    # twice their bytes in flight a barrier (UNet's head: 57.4 -> 47.9 us, tuned on an H100); as
    # measured, with cp.async's ring (elsewhere the stages go through registers)
    thin_scalar = (pass_ is Pass.WGRAD and gemm.k >= 1024 and va == 1 and vb >= WIDE_STEP_VEC
                   and gemm.m <= FRAG and target.info.cp_async)
    # a pointwise wgrad just past 128 on one side: one tile, with its own K-step (small_layer_rules)
    one = None if scalar else wgrad_one_tile(problem, pass_, target)
    bk = one.block_k if one is not None else 64 if big_k or thin_scalar or narrow is not None else 32
    if narrow is None and one is None:
        reasons.append(
            f"K-step {bk}: "
            + ("long reduction, fewer barriers per FLOP" if big_k else
               f"dy's K={gemm.m} scalar row(s) are a few accesses a step at any depth; a 64-deep step doubles x's "
               "16-byte loads in flight a barrier" if thin_scalar else "two k16 MMAs per fragment per barrier"
               + (f" (a {'scalar' if min(va, vb) == 1 else 'two-channel'} gather keeps the step short: fewer accesses "
                  "in flight per thread)" if min(va, vb) < WIDE_STEP_VEC else ""))
        )

    warps = 8 if bm * bn >= 128 * 128 else 4
    crowded = None  # a warp of many fragments whose gather or MMA inputs hold many registers too
    if warps == 4 and bm * bn // (warps * FRAG * FRAG) >= CROWDED_FRAGMENTS:
        if pass_ is Pass.WGRAD and vb == 1:
            crowded = "x's im2col gathered one channel at a time"
        elif pass_ is Pass.FPROP and va == 1 and not target.info.cp_async:
            crowded = "x's im2col gathered one channel at a time and staged through registers"
        elif bk == 64 and target.info.wmma_input_copies > 1:
            crowded = "64-deep steps staged through registers and WMMA inputs held twice"
    # wgrad's one-channel gathers go through registers (cp.async moves 4 bytes or more), each
    # access with its own (r, s, c) and pixel: with both operands one channel at a time (C and K
    # odd) a 32x128 tile of 4 warps makes 40 accesses a thread and step, and held 254 (fp16) to
    # 255 registers (bf16: 26 local accesses, sm_80, scripts/compile_fuzz.py) with only 4
    # fragments a warp; 8 warps held 144-153 on sm_75-sm_90.  fprop's one-channel gathers share
    # a pixel's decomposition across a row and held 128-170 at 40 accesses: left as they are.
    threads = warps * target.warp_size
    scalar_accesses = ((bm * bk if va == 1 else 0) + (bn * bk if vb == 1 else 0)) // threads
    if pass_ is Pass.WGRAD and warps == 4 and scalar_accesses > REGISTER_GATHER_ACCESSES:
        crowded = crowded or f"{scalar_accesses} one-channel accesses a thread and step, staged through registers"
    if crowded:
        warps = 8
    # RDNA3 holds each WMMA input twice: with a gather one channel at a time through registers, a
    # warp of 8 fragments spilled even on 8 warps (gfx1100, scripts/compile_fuzz.py: 12 wgrads of
    # odd C on 128x128 tiles, 16-35 VGPRs; fprop of C = 1; dgrad on a 144-wide exact tile, 90).
    rdna_scalar = target.info.wmma_input_copies > 1 and min(va, vb) == 1
    halved = False
    if rdna_scalar and bm * bn // (warps * FRAG * FRAG) > RDNA_SCALAR_FRAGMENTS:
        if warps == 4:
            warps = 8
        else:
            bn, halved = bn // 2, True
        crowded = crowded or "a gather one channel at a time through registers and WMMA inputs held twice"
    wm, wn = _warp_grid(bm, bn, warps)
    if one is not None:  # (never a narrow stream tile, a fprop/dgrad one, nor RDNA: no cp.async)
        bm, bn, wm, wn = one.block_m, one.block_n, one.warps_m, one.warps_n
        reasons.append(one.why)
    exact = None if scalar or rdna_scalar else exact_n_tile(problem, pass_)
    if exact is not None:
        bm, bn, wm, wn, why = exact
        reasons.append(why)
    reasons.append(
        f"{wm * wn} warps as {wm}x{wn}: warp tile {bm // wm}x{bn // wn} "
        f"= {(bm // wm // FRAG) * (bn // wn // FRAG)} fragments per warp"
        + (f" ({crowded}: with {CROWDED_FRAGMENTS} fragments a warp the kernel spilled registers)"
           if crowded and exact is None else "")
        + (f"; block N {bn}, not {2 * bn}, so a warp holds {RDNA_SCALAR_FRAGMENTS}" if halved else "")
    )

    if scalar:
        reasons.append("vec A/B 1/1: scalar staging forced by the caller")
    else:
        reasons.append(
            f"vec A {va} (run of {ca}), vec B {vb} (run of {cb}): "
            "8 fp16 = one 16-byte load when the run is a multiple of 8, else the widest divisor"
        )

    reads: list[DType] = []
    for name, v in (("A", va), ("B", vb)):
        direct = in_dtype == "float32" and v == 1
        reads.append("float32" if direct else elem)
        if in_dtype == "float32":
            reasons.append(
                f"read {name} as "
                + ("float32, cast in the scalar gather" if direct else f"{elem} after one cast pass (cheaper than a wide fp32 gather)")
            )

    cp_async = target.info.cp_async
    stages = 3 if cp_async else 2
    if cp_async and big_k:
        stages = 4
    if one is not None:
        stages = one.stages
    reasons.append(
        f"{stages} stages: "
        + ("cp.async ring with zero-fill for the halo" if cp_async else "register-staged double buffer (no cp.async on this target)")
    )

    candidate = Plan(bm, bn, bk, wm, wn, stages, va, vb, reads[0], reads[1], 1)
    # Shrink until it fits: fewer stages first (least costly), then a shorter K-step.
    while smem_bytes(candidate, pass_, target.warp_size) > target.smem_limit:
        if candidate.stages > 2:
            candidate = _replace(candidate, stages=candidate.stages - 1)
        elif candidate.block_k > 32:
            candidate = _replace(candidate, block_k=32)
        else:  # pragma: no cover - 128x128x32x2 always fits the smallest target
            break
    if candidate.stages != stages or candidate.block_k != bk:
        reasons.append(
            f"shrunk to {candidate.stages} stages x K-step {candidate.block_k} to fit {target.smem_limit} bytes of shared memory"
        )
    split, why = split_k(candidate, problem, pass_, target, smem_bytes(candidate, pass_, target.warp_size, problem),
                         ONE_TILE_BLOCKS_PER_SM if one is not None else None)
    candidate = _replace(candidate, split_k=split)
    reasons.append(why)
    reasons.append(
        f"strided dgrad: {problem.stride[0] * problem.stride[1]} residue classes of input pixels, each "
        "reducing over only the filter taps that reach it (no MMAs on zero-inserted positions)"
        if pass_ is Pass.DGRAD and problem.stride != (1, 1)
        else f"shared memory {smem_bytes(candidate, pass_, target.warp_size, problem)} bytes"
    )
    final = _replace(candidate, reasons=tuple(reasons))
    check_plan(final, problem, pass_, target, in_dtype, mma_dtype=elem)
    halo = None if scalar else halo_default(problem, pass_, target, in_dtype, final)
    if halo is not None:
        return halo
    return final


def _replace(p: Plan, **changes) -> Plan:
    import dataclasses

    return dataclasses.replace(p, **changes)


def check_plan(plan: Plan, geometry: ConvGeometry, pass_: Pass | str, target: Target, in_dtype: DType, *,
               mma_dtype: DType | None = None) -> None:
    """Reject a plan this kernel cannot run, naming what is wrong.  Used for hand plans too."""
    pass_ = Pass.parse(pass_)
    elem = mma_dtype_for(in_dtype, mma_dtype, target)
    if plan.split_reduce == "grid":
        _check_grid_reduce(plan, pass_, target)
    if geometry.depthwise or isinstance(plan.loop, Depthwise):
        if not isinstance(plan.loop, Depthwise):
            raise ValueError(f"groups={geometry.groups}: a depthwise layer runs the Depthwise kind, not "
                             f"{type(plan.loop).__name__}")
        return depthwise.check(plan, geometry, pass_, target, in_dtype, elem)
    if geometry.groups > 1 and plan.loop.halo:
        raise ValueError(f"{type(plan.loop).__name__}: {halo_eligible(geometry, pass_, in_dtype)}; a grouped "
                         "layer runs the im2col loops (Im2col, Wgmma)")
    ca, cb = gathered_channels(geometry, pass_)
    for name, vec, run in (("vec_a", plan.vec_a, ca), ("vec_b", plan.vec_b, cb)):
        if run % vec:
            raise ValueError(
                f"plan.{name}={vec} does not divide the operand's contiguous run of {run} channels; use {vector_width(run)} or less"
            )
    for name, read in (("read_a", plan.read_a), ("read_b", plan.read_b)):
        if read == "float32" and in_dtype != "float32":
            raise ValueError(f"plan.{name}='float32' needs float32 inputs, but in_dtype is {in_dtype}")
        if read not in ("float32", elem):
            raise ValueError(f"plan.{name}={read!r}: a kernel with {elem} MMAs reads {elem} or float32")
    threads = plan.warps * target.warp_size
    if threads > 1024:
        raise ValueError(f"plan has {plan.warps} warps = {threads} threads; a block holds at most 1024")
    if plan.block_k % 16:
        raise ValueError(f"plan.block_k={plan.block_k} must be a multiple of 16")
    for name, tile in (("block_m", plan.block_m), ("block_n", plan.block_n), ("block_k", plan.block_k)):
        if tile > 256:
            raise ValueError(f"plan.{name}={tile} is larger than convgen's largest tile (256)")
    if plan.loop.halo:
        _check_halo(plan, geometry, pass_, target, in_dtype)
    if isinstance(plan.loop, Wgmma):
        _check_wgmma(plan, pass_, target)
    if isinstance(plan.loop, TmaHalo):
        why = tma_halo.eligible(geometry, pass_, target, in_dtype)
        if why is None and (plan.vec_a, plan.vec_b, plan.read_a, plan.read_b) != (8, 8, in_dtype, in_dtype):
            why = "copies 16-bit operands as they are: vec_a = vec_b = 8, read_a = read_b = in_dtype"
        if why:
            raise ValueError(f"TmaHalo: the TMA halo loop {why}")
    if isinstance(plan.loop, TmaWgmma):
        why = tma_eligible(geometry, pass_, target, in_dtype)
        if why is None and (plan.vec_a, plan.vec_b, plan.read_a, plan.read_b) != (8, 8, in_dtype, in_dtype):
            why = "copies fp16 operands as they are: vec_a = vec_b = 8, read_a = read_b = 'float16'"
        if why is None and pass_ is not Pass.FPROP and plan.block_n % 64:
            why = (f"stages {pass_.value}'s B as boxes of 64 channels (one 128-byte swizzle row, N-major): "
                   f"plan.block_n={plan.block_n} must be a multiple of 64")
        if why is None and pass_ is not Pass.WGRAD and plan.split_k != 1:
            why = f"reduces the whole of {pass_.value}'s K in one block: plan.split_k must be 1, got {plan.split_k}"
        if why is None and plan.loop.persistent and pass_ is Pass.WGRAD and (geometry.groups > 1 or plan.loop.pingpong):
            why = ("runs wgrad persistent (TmaWgmma(persistent=True): stream-K) on dense layers with cooperative "
                   "consumer warpgroups only: no groups, no ping-pong")
        if why is None and plan.loop.cluster > 1 and (
                pass_ is Pass.WGRAD or (pass_ is Pass.DGRAD and geometry.stride != (1, 1))):
            why = (f"launches clusters (TmaWgmma.cluster={plan.loop.cluster}) in fprop and stride-1 dgrad, whose "
                   "blocks side by side along M walk the same K-steps and share the weights' tile; "
                   f"{pass_.value}{' with stride ' + str(geometry.stride) if pass_ is Pass.DGRAD else ''} keeps "
                   "cluster=1")
        if why is None and plan.loop.tma_store:
            why = _tma_store_refusal(geometry, pass_)
        if why is None:
            why = tma_group_tile(geometry, pass_, plan.block_m, plan.block_n)
        if why:
            raise ValueError(f"TmaWgmma: the TMA main loop {why}")
    tiles = tiles_per_block(plan)
    if tiles > 1 and reduction_steps(plan, pass_, geometry) != 1:
        raise ValueError(
            f"{type(plan.loop).__name__}.tiles={tiles}: several tiles per block need the halo path's one-step "
            f"reductions (stride 1, {'C' if pass_ is Pass.FPROP else 'K'} <= block_k = {plan.block_k}, channels in "
            "16-byte runs)"
        )
    smem = smem_bytes(plan, pass_, target.warp_size, geometry)
    if smem > target.smem_limit:
        raise ValueError(
            f"plan needs {smem} bytes of shared memory but {target.arch} allows {target.smem_limit}; "
            "use fewer stages or smaller tiles"
        )
    if plan.split_k > 65535:
        raise ValueError(f"plan.split_k={plan.split_k} exceeds the grid's z limit (65535)")


def _tma_store_refusal(geometry: ConvGeometry, pass_: Pass) -> str | None:
    """Why the copy engine cannot store this pass's output (TmaWgmma.tma_store), or None: it
    stores boxes of a dense 2-D tensor whose rows are whole 16-byte runs, which fprop's y
    [N*P*Q][K] and a stride-1 dgrad's dx [N*H*W][C] are; a strided dgrad's residue classes
    scatter their rows over dx, and wgrad's dW leaves through its split-K sums."""
    what = "stores through the copy engine (TmaWgmma.tma_store)"
    if pass_ is Pass.WGRAD or (pass_ is Pass.DGRAD and geometry.stride != (1, 1)):
        return (f"{what} in fprop and in stride-1 dgrad, whose outputs are dense [pixels][channels] tensors; "
                f"{pass_.value}{' with stride ' + str(geometry.stride) if pass_ is Pass.DGRAD else ''} keeps "
                "tma_store=False")
    channels = geometry.k if pass_ is Pass.FPROP else geometry.c
    if channels % 8:
        return (f"{what} in rows of whole 16-byte runs: {'K' if pass_ is Pass.FPROP else 'C'}={channels} must be a "
                "multiple of 8")
    return None


def _check_grid_reduce(plan: Plan, pass_: Pass, target: Target) -> None:
    """Where split-K's slices, or stream-K's parts, may be summed in the main kernel
    (plan.split_reduce="grid"): wgrad (the one pass whose plans split K) on CUDA (a
    cooperative launch and a grid-wide barrier through cooperative_groups)."""
    why = ("wgrad's split-K or stream-K only (fprop and dgrad plans reduce K in one block)" if pass_ is not Pass.WGRAD
           else f"a CUDA target (a cooperative launch), not {target.arch}" if target.backend != "cuda"
           else None)
    if why:
        raise ValueError(f"plan.split_reduce='grid' sums the slices after a grid-wide barrier: {why}")


def _check_wgmma(plan: Plan, pass_: Pass, target: Target) -> None:
    why = (f"needs warpgroup MMAs, which {target.arch} does not have" if not target.info.wgmma
           else "computes fprop and dgrad only" if pass_ is Pass.WGRAD
           else "reads both operands as fp16 in 16-byte runs (vec_a = vec_b = 8, read fp16)"
           if (plan.vec_a, plan.vec_b) != (8, 8) or plan.read_a != plan.read_b or plan.read_a == "float32" else None)
    if why:
        raise ValueError(f"Wgmma: the wgmma main loop {why}")


# StagedHalo keeps its whole input halo in shared memory next to the pipeline.
MAX_STAGED_HALO_BYTES = 48 * 1024


def halo_eligible(geometry: ConvGeometry, pass_: Pass, in_dtype: DType = "float16") -> str | None:
    """Why no halo kind can run this pass (None when one can: StagedHalo where
    `stages_whole_halo`, else HaloTile, HaloLdsm and FlatHalo)."""
    if pass_ is Pass.WGRAD:
        return "the halo path computes fprop and dgrad only (wgrad reduces over pixels)"
    if geometry.groups > 1:
        return f"groups={geometry.groups}: the halo kinds stage every channel of a pixel, not one group's"
    if in_dtype not in MMA_DTYPES:
        return "the halo path reads fp16 inputs"
    if stages_whole_halo(geometry, pass_):
        return None  # StagedHalo: any stride
    if geometry.stride != (1, 1):
        return f"the halo path needs stride 1, got {geometry.stride}"
    ca, _ = gathered_channels(geometry, pass_)
    if ca % 8:
        return (f"the halo path stages 16-byte runs of the reduced channels: "
                f"{'C' if pass_ is Pass.FPROP else 'K'}={ca} is not a multiple of 8")
    return None


def _check_halo(plan: Plan, geometry: ConvGeometry, pass_: Pass, target: Target, in_dtype: DType) -> None:
    loop, name = plan.loop, repr(plan.loop)
    why = halo_eligible(geometry, pass_, in_dtype)
    staged_layer = stages_whole_halo(geometry, pass_)
    if why is None and staged_layer and isinstance(loop, (HaloTile, FlatHalo)):
        why = (f"reads each tap's fragments in place, which needs C in 16-byte runs (C={geometry.c}); "
               "StagedHalo stages this layer's whole halo for the im2col gather")
    if why is None and isinstance(loop, StagedHalo) and not staged_layer:
        why = ("stages the whole halo of fprop layers whose C is not a multiple of 8 only; this layer's taps "
               "are read in place: use HaloTile")
    if why:
        raise ValueError(f"{name}: {why}")
    if (plan.read_a, plan.read_b) != (in_dtype, in_dtype):
        raise ValueError(f"a halo plan ({name}) reads fp16 inputs as they are: read_a = read_b = 'float16'")
    if isinstance(loop, HaloLdsm) and (staged_layer or not (target.info.ldmatrix and target.info.mma_sync)):
        raise ValueError(f"{name}: tiles narrower than a 16-pixel fragment need ldmatrix and mma.sync.m16n8k16 "
                         f"({target.arch}: {'yes' if target.info.ldmatrix and target.info.mma_sync else 'no'}) and "
                         "the reduced channels read in place; use a HaloTile (a multiple of 16 pixels wide)")
    if isinstance(loop, StagedHalo):
        staged = staged_halo_halves(plan, geometry) * 2
        if staged > MAX_STAGED_HALO_BYTES:
            raise ValueError(f"{name}: the block's input halo takes {staged} bytes of shared "
                             f"memory (at most {MAX_STAGED_HALO_BYTES}); use a smaller tile")
        return
    vec_b = halo_vec_b(geometry, pass_)
    if (plan.vec_a, plan.vec_b) != (8, vec_b):
        raise ValueError(f"a halo plan ({name}) reads fp16 with vec_a = 8 and vec_b = {vec_b} for this shape")


def halo_vec_b(geometry: ConvGeometry, pass_: Pass) -> int:
    """The in-place halo kinds' weight access width: fprop's weight rows run over C (a multiple
    of 8 there); dgrad's over the C dx channels, which may be any count (C = 3 first layers)."""
    return 8 if pass_ is Pass.FPROP else vector_width(geometry.c)


def make_spec(
    problem: ConvProblem,
    pass_: Pass | str,
    *,
    target: Target | None = None,
    epilogue: Epilogue | None = None,
    in_dtype: DType = "float16",
    plan_: Plan | None = None,
    scalar: bool = False,
    mma_dtype: DType | None = None,
    pack: int = 1,
) -> KernelSpec:
    """The one way to build a :class:`KernelSpec`: plans it unless a plan is given, and checks a given plan.
    ``pack``: ``problem`` is a grouped wgrad's slabs, each ``pack`` of its groups (KernelSpec.pack)."""
    pass_ = Pass.parse(pass_)
    target = target or Target()
    epilogue = epilogue or Epilogue()
    epilogue.check_pass(pass_)
    elem = mma_dtype_for(in_dtype, mma_dtype, target)
    if plan_ is None:
        plan_ = plan(problem, pass_, target, in_dtype, scalar=scalar, mma_dtype=elem)
    else:
        check_plan(plan_, problem, pass_, target, in_dtype, mma_dtype=elem)
    check_index_limits(problem, pass_, plan_)  # the kernels' 32-bit ints (convgen/limits.py)
    return KernelSpec(problem.geometry, pass_, epilogue, in_dtype, target, plan_, mma_dtype=elem, pack=pack)
