"""Backend descriptions: everything that differs between CUDA/WMMA and HIP/rocWMMA source.

The templates are written once; they read these fields instead of testing the
backend name, so a difference lives here, in one place (the model is tinygrad's
per-backend renderers over one C-style base).
"""

from __future__ import annotations

from dataclasses import dataclass

from .ir import Target


@dataclass(frozen=True)
class Backend:
    name: str
    file_ext: str
    includes: tuple[str, ...]
    wmma_ns: str  # the namespace holding fragment / load_matrix_sync / mma_sync
    frag_half: str  # the fp16 element type fragments are declared with
    warp_size: int
    cp_async: bool  # asynchronous global->shared copies (sm_80+)
    warp_sync: str  # orders a warp's shared-memory writes before its lanes read them
    ptx_store16: bool  # 16-byte global stores written in PTX (NVVM splits some uint4 stores)

    @property
    def extern_shared(self) -> str:
        return "extern __shared__ __align__(128) unsigned char smem_raw[];"


def backend_for(target: Target) -> Backend:
    if target.backend == "cuda":
        return Backend(
            name="cuda",
            file_ext="cu",
            includes=("cuda_fp16.h", "mma.h"),
            wmma_ns="nvcuda::wmma",
            frag_half="__half",
            warp_size=target.warp_size,
            cp_async=target.info.cp_async,
            warp_sync="__syncwarp()",
            ptx_store16=True,
        )
    return Backend(
        name="hip",
        file_ext="hip",
        includes=("hip/hip_runtime.h", "hip/hip_fp16.h", "rocwmma/rocwmma.hpp"),
        wmma_ns="rocwmma",
        frag_half="rocwmma::float16_t",
        warp_size=target.warp_size,
        cp_async=False,
        # HIP 6.4 has no __syncwarp().  A wavefront runs in lockstep and one wave's LDS
        # accesses complete in order, so what is needed is a compiler-level ordering point:
        # wave_barrier alone does not stop LLVM from moving the epilogue's scratch read above
        # store_matrix_sync's LDS writes; the wavefront-scope release/acquire fences do (they
        # emit no instruction).  One expression, so the template's `{{ be.warp_sync }};` works.
        warp_sync=(
            '(__builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront"), '
            "__builtin_amdgcn_wave_barrier(), "
            '__builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront"))'
        ),
        ptx_store16=False,
    )
