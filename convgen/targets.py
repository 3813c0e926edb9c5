"""One description per GPU architecture: what it can do, and how its source is spelled.

The planner and the tuner ask these capability fields (``cp_async``, ``ldmatrix``,
``mma_sync``, ``wgmma``, ...) and never an arch or backend name, so a new part is one
entry here.  The templates read the spelling fields (headers, WMMA namespace, fragment
type, warp sync) through ``be``, so CUDA and HIP differ here and not in ``if cuda``
branches (the model is tinygrad's renderers, capabilities as attributes).

:class:`convgen.ir.Target` is the user-facing spec (an arch name and an SM count);
``Target.info`` is its description from :data:`ARCHES`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Arch:
    """One architecture.  Capabilities are facts of the silicon and the toolchain we
    compile with; ``default_sm_count`` is a typical part's, used when no device is attached."""

    arch: str
    backend: Literal["cuda", "hip"]
    warp_size: int
    smem_limit: int  # bytes of shared memory (LDS) one block may use (the opt-in maximum)
    default_sm_count: int
    cp_async: bool  # asynchronous global->shared copies with zero-fill (sm_80+)
    ldmatrix: bool  # ldmatrix.sync: a warp loads 8x8 fp16 tiles from per-lane row addresses (sm_75+)
    mma_sync: bool  # mma.sync.m16n8k16 with fp16 operands, fp32 accumulators (sm_80+)
    wgmma: bool  # warpgroup MMAs reading shared memory through descriptors (sm_90a)
    tma: bool  # the Tensor Memory Accelerator's bulk tensor copies (sm_90); no main loop uses it yet
    bf16_mma: bool  # tensor-core MMAs on bfloat16 operands (WMMA/mma.sync .bf16 on sm_80+, rocWMMA on these GPUs)
    # How the source is spelled for this backend.
    file_ext: str
    includes: tuple[str, ...]
    wmma_ns: str  # the namespace holding fragment / load_matrix_sync / mma_sync
    frag_half: str  # the fp16 element type fragments are declared with
    bf16_type: str  # a bfloat16 kernel's staged element type (its half_t); converts from and to float by casts
    frag_bf16: str  # the bf16 element type fragments are declared with
    bf16_include: str  # the header declaring bf16_type
    warp_sync: str  # orders a warp's shared-memory writes before its lanes read them
    ptx_store16: bool  # 16-byte global stores written in PTX (NVVM splits some uint4 stores)
    # Copies of each WMMA input a lane holds: RDNA3 (gfx11) wants A and B replicated in both
    # half-waves (16 halves a lane, twice RDNA4's), so its fragments cost twice the VGPRs.
    wmma_input_copies: int = 1
    # The fewest bytes one DRAM access moves: an HBM pseudo-channel's burst (64: A100, H100,
    # H200, MI300X), a GDDR6 channel's (32: T4, RTX 30 and 40, RDNA).  A block reading part of
    # a granule pays for all of it (convgen/depthwise.py, whole_pixel_chunk).
    dram_granule: int = 64

    @property
    def name(self) -> str:
        """The backend's name ("cuda" or "hip"): what the emitter's metadata records."""
        return self.backend

    @property
    def extern_shared(self) -> str:
        return "extern __shared__ __align__(128) unsigned char smem_raw[];"


def _cuda(arch: str, smem_kib: int, sms: int, *, sm: int) -> Arch:
    return Arch(
        arch=arch, backend="cuda", warp_size=32, smem_limit=smem_kib * 1024, default_sm_count=sms,
        cp_async=sm >= 80, ldmatrix=sm >= 75, mma_sync=sm >= 80, wgmma=sm == 90, tma=sm >= 90, bf16_mma=sm >= 80,
        file_ext="cu", includes=("cuda_fp16.h", "mma.h"), wmma_ns="nvcuda::wmma", frag_half="__half",
        bf16_type="__nv_bfloat16", frag_bf16="__nv_bfloat16", bf16_include="cuda_bf16.h",
        warp_sync="__syncwarp()", ptx_store16=True,
    )


# HIP 6.4 has no __syncwarp().  A wavefront runs in lockstep and one wave's LDS accesses
# complete in order, so what is needed is a compiler-level ordering point: wave_barrier
# alone does not stop LLVM from moving the epilogue's scratch read above store_matrix_sync's
# LDS writes; the wavefront-scope release/acquire fences do (they emit no instruction).
# One expression, so the template's `{{ be.warp_sync }};` works.
_HIP_WARP_SYNC = (
    '(__builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront"), '
    "__builtin_amdgcn_wave_barrier(), "
    '__builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront"))'
)


def _hip(arch: str, warp_size: int, sms: int) -> Arch:
    return Arch(
        arch=arch, backend="hip", warp_size=warp_size, smem_limit=64 * 1024, default_sm_count=sms,
        cp_async=False, ldmatrix=False, mma_sync=False, wgmma=False, tma=False, bf16_mma=True,
        file_ext="hip", includes=("hip/hip_runtime.h", "hip/hip_fp16.h", "rocwmma/rocwmma.hpp"),
        wmma_ns="rocwmma", frag_half="rocwmma::float16_t",
        # rocWMMA's bf16 fragments hold hip_bfloat16 (rocwmma::bfloat16_t), so the stage holds it too.
        bf16_type="rocwmma::bfloat16_t", frag_bf16="rocwmma::bfloat16_t", bf16_include="hip/hip_bfloat16.h", warp_sync=_HIP_WARP_SYNC, ptx_store16=False,
    )


ARCHES: dict[str, Arch] = {
    # smem limits are the per-block opt-in maxima (cudaDevAttrMaxSharedMemoryPerBlockOptin).
    "sm_75": dataclasses.replace(_cuda("sm_75", 64, 40, sm=75), dram_granule=32),  # T4 (GDDR6)
    "sm_80": _cuda("sm_80", 163, 108, sm=80),  # A100 (HBM2e)
    "sm_86": dataclasses.replace(_cuda("sm_86", 99, 82, sm=86), dram_granule=32),  # RTX 3090 (GDDR6X)
    "sm_89": dataclasses.replace(_cuda("sm_89", 99, 128, sm=89), dram_granule=32),  # RTX 4090 (GDDR6X)
    "sm_90": _cuda("sm_90", 227, 132, sm=90),  # H100 / H200 SXM (HBM3, HBM3e)
    "gfx1100": dataclasses.replace(_hip("gfx1100", 32, 96), wmma_input_copies=2, dram_granule=32),  # RX 7900 XTX
    "gfx1201": dataclasses.replace(_hip("gfx1201", 32, 64), dram_granule=32),  # RX 9070 XT (RDNA4, GDDR6)
    "gfx942": _hip("gfx942", 64, 304),  # MI300X (CDNA3, HBM3)
}
