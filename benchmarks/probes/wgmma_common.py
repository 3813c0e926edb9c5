"""What the wgmma probes share (wgmma_probe.py, wgmma_row_offset_probe.py, tma_halo_probe.py,
tma_halo_loop_probe.py): one m64n64k16 wgmma's operands and accumulators in CUDA source, the
halo loop's taps, and the compile-only check that runs anywhere (NVRTC needs no GPU).  The
4-D tiled TMA copy of a halo box is convgen/hopper.h's tma_load_4d."""

from __future__ import annotations

REGS = 64 * 64 // 128  # fp32 accumulators a thread of the warpgroup holds for m64n64


def wgmma_m64n64k16(da: str, db: str, trans_b: int = 0) -> str:
    """One ``wgmma.mma_async m64n64k16`` (fp16 in, fp32 accumulated into ``float d[REGS]``)
    on the descriptors named ``da`` and ``db``, as a CUDA statement."""
    d_regs = ", ".join(f"%{i}" for i in range(REGS))
    d_ops = ", ".join(f'"+f"(d[{i}])' for i in range(REGS))
    return (r'asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %' + str(REGS + 2) + r', 0;\n"'
            + r' "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {' + d_regs + r'}, %' + str(REGS)
            + r', %' + str(REGS + 1) + r', p, 1, 1, 0, ' + str(trans_b) + r';\n}\n"'
            + f' : {d_ops} : "l"({da}), "l"({db}), "r"(1));')




def halo_taps(a_desc: str, tap_bytes: str) -> str:
    """The halo-reusing loop's multiply, as CUDA statements: ``float d[REGS]`` zeroed, then
    every tap's four k16 wgmmas, position m reading tap (r, s) from halo row m + r*P + s (the
    tap's A operand ``a``, started that many 128-byte rows into ``halo``), the tap's weights at
    ``weights + tap * tap_bytes``.  ``a_desc``: the expression of a's descriptor at k16 step
    ``kk``.  Needs ``halo``, ``weights``, P, R and S in scope; the caller commits and waits."""
    return r"""
    float d[""" + str(REGS) + r"""];
#pragma unroll
    for (int i = 0; i < """ + str(REGS) + r"""; ++i) d[i] = 0.0f;
    wgmma_fence();
#pragma unroll
    for (int tap = 0; tap < R * S; ++tap) {
      const unsigned char* a = halo + ((tap / S) * P + tap % S) * 128;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const unsigned long long da = """ + a_desc + ", db = sw128_desc(weights + tap * " + tap_bytes + r""", kk * 32);
        """ + wgmma_m64n64k16("da", "db") + r"""
      }
    }
"""


# Accumulator j*4 + {0,1,2,3} of lane l in warp w: rows 16w + l/4 (+8), columns 8j + 2(l%4) (+1).
STORE_D = r"""
  {
    const int w_ = threadIdx.x / 32, l_ = threadIdx.x % 32;
    for (int j = 0; j < 64 / 8; ++j) {
      const int row = 16 * w_ + l_ / 4, col = 8 * j + 2 * (l_ % 4);
      D[row * 64 + col] = d[j * 4 + 0];
      D[row * 64 + col + 1] = d[j * 4 + 1];
      D[(row + 8) * 64 + col] = d[j * 4 + 2];
      D[(row + 8) * 64 + col + 1] = d[j * 4 + 3];
    }
  }
"""


def compile_only(source: str, kernels: tuple[str, ...], needs: tuple[str, ...] = ("HGMMA",), note: str = "") -> int:
    """Compile ``source`` for sm_90a and report each kernel's registers, stack and the count of
    each SASS opcode in ``needs``; 1 unless every kernel has every one of them."""
    from convgen.compile import cached_binary
    from convgen.tools.sass import find_cuobjdump, read_cubin

    cubin = cached_binary(source, arch="sm_90a")
    tool = find_cuobjdump()
    if tool is None:
        print("compiled for sm_90a; no cuobjdump to read the SASS (install the dev extra)")
        return 0
    found = read_cubin(cubin, tool)
    ok = True
    for name in kernels:
        k = found[name]
        counts = ", ".join(f"{op} x{k.count(op)}" for op in needs)
        print(f"sm_90a cubin, {name}: {k.registers} registers, {k.stack} B stack, {counts}{note}")
        ok &= all(k.count(op) > 0 for op in needs)
    return 0 if ok else 1
