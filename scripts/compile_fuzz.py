"""Plan, emit and compile random layers for one arch, and report every failure and spill.

A CPU-only hardening sweep: NVRTC compiles real SASS with no GPU, and cuobjdump reads each
kernel's registers and local-memory loads and stores.  It walks the path a call takes (the
stem pad and group packing of `group_pack.copied_problem`, then `make_spec`, `emit` and the
compile), over layers drawn from the families real networks use, plus odd ones: any channel
count, 1-7 taps a side, strides, dilations, groups and depthwise, bf16 and fp32 inputs, and
every epilogue.  On an AMD arch, clang compiles the HIP kernels to ISA instead (the toolchain
scripts/hip_check.sh uses; convgen/tools/hip_isa.py) and its metadata gives VGPRs and spills.

    python3 scripts/compile_fuzz.py --arch sm_90 --seconds 1800 --seed 1 --jobs 2
    eval "$(scripts/setup_hip_toolchain.sh)"; python3 scripts/compile_fuzz.py --arch gfx1100 --sms 96

Each finding is one line that reproduces it (`convgen emit` arguments). The exit status is 1
when a layer failed to plan, emit or compile, or a kernel spilled at its register cap. Run it
after a planner or template change that the suites do not cover. It is not part of CI: its
draws are random, and it runs as long as it is given.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from convgen.compile import compile_binary  # noqa: E402
from convgen.emit import KernelSource, emit  # noqa: E402
from convgen.group_pack import copied_problem  # noqa: E402
from convgen.ir import ConvProblem, Epilogue, Pass, Target  # noqa: E402
from convgen.planner import make_spec  # noqa: E402
from convgen.tools.hip_isa import compile_to_isa, toolchain  # noqa: E402
from convgen.tools.sass import find_cuobjdump, read_cubin  # noqa: E402

WIDTHS = (1, 3, 4, 8, 12, 16, 24, 32, 40, 48, 64, 80, 96, 112, 128, 144, 160, 192, 256, 320, 384, 512, 576, 960)


def draw_layer(rng: random.Random) -> tuple[ConvProblem, str]:
    """A layer and its input dtype: mostly real-network families, a fifth anything odd."""
    kind = rng.choice(("3x3", "1x1", "stem", "depthwise", "grouped", "odd"))
    n = rng.choice((1, 2, 8, 16, 32, 64, 128, 256))
    h = rng.choice((7, 14, 17, 28, 32, 56, 64, 112, 128, 224))
    w = h if rng.random() < 0.8 else rng.randint(1, 300)
    stride, pad, dil, groups = 1, 0, 1, 1
    if kind == "3x3":
        c, k, r, s = rng.choice(WIDTHS[3:]), rng.choice(WIDTHS[3:]), 3, 3
        stride, pad = rng.choice((1, 1, 2)), 1
        dil = rng.choice((1, 1, 1, 2))
        pad = dil
    elif kind == "1x1":
        c, k, r, s = rng.choice(WIDTHS[2:]), rng.choice(WIDTHS[2:]), 1, 1
        stride = rng.choice((1, 1, 2))
    elif kind == "stem":
        c, k = rng.choice((1, 3, 4)), rng.choice((16, 24, 32, 48, 64, 96))
        r = s = rng.choice((3, 4, 5, 6, 7))
        stride, pad = rng.choice((1, 2, 4)), r // 2
    elif kind == "depthwise":
        c = rng.choice(WIDTHS[3:])
        k = c * rng.choice((1, 1, 1, 2))
        r = s = rng.choice((3, 5, 7))
        stride, pad, groups = rng.choice((1, 2)), r // 2, c
    elif kind == "grouped":
        groups = rng.choice((2, 4, 8, 16, 32, 64))
        c, k = groups * rng.choice((1, 2, 4, 8, 16, 32)), groups * rng.choice((1, 2, 4, 8, 16, 32))
        r = s = rng.choice((1, 3))
        stride, pad = rng.choice((1, 2)), r // 2
    else:
        c, k = rng.randint(1, 300), rng.randint(1, 300)
        r, s = rng.randint(1, 7), rng.randint(1, 7)
        stride, dil = rng.randint(1, 3), rng.randint(1, 3)
        pad = rng.randint(0, 3)
        h, w = rng.randint(max(1, (r - 1) * dil + 1 - 2 * pad), 80), rng.randint(max(1, (s - 1) * dil + 1 - 2 * pad), 80)
    h, w = max(h, (r - 1) * dil + 1 - 2 * pad), max(w, (s - 1) * dil + 1 - 2 * pad)
    in_dtype = rng.choice(("float16",) * 6 + ("bfloat16", "float32"))
    return ConvProblem(h, w, c, k, r, s, stride, pad, dil, groups, n=n), in_dtype


def draw_epilogue(rng: random.Random, pass_: Pass, in_dtype: str) -> Epilogue:
    out = rng.choice(("float16", "float32")) if in_dtype != "bfloat16" else rng.choice(("bfloat16", "float32"))
    if pass_ is Pass.FPROP:
        act = rng.choice(("", "", "relu", "gelu"))
        return Epilogue(bias=rng.random() < 0.5, relu=act == "relu", gelu=act == "gelu", out_dtype=out,
                        residual=rng.random() < 0.25)
    if pass_ is Pass.WGRAD:
        return Epilogue(bias=rng.random() < 0.5, out_dtype=out)
    return Epilogue(out_dtype=out)


def describe(p: ConvProblem, pass_: Pass, epi: Epilogue, in_dtype: str) -> str:
    """The layer as `convgen emit` arguments, with the epilogue's flags."""
    pair = lambda v: f"{v[0]},{v[1]}"  # noqa: E731
    flags = [f"--pass {pass_.value}", f"-n {p.n} -h {p.h} -w {p.w} -c {p.c} -k {p.k} -r {p.r} -s {p.s}",
             f"--stride {pair(p.stride)} --padding {pair(p.padding)} --dilation {pair(p.dilation)}",
             f"--in-dtype {in_dtype} --out-dtype {epi.out_dtype}"]
    if p.groups > 1:
        flags.append(f"--groups {p.groups}")
    if in_dtype == "bfloat16":
        flags.append("--dtype bfloat16")
    flags += [f"--{f}" for f in ("relu", "gelu", "residual") if getattr(epi, f)]
    if not epi.bias:
        flags.append("--no-bias")
    return " ".join(flags)


def _cuda_findings(src: KernelSource) -> tuple[list[str], list[str]]:
    """NVRTC's cubin, read back: kernels that spilled at the register cap their launch bounds
    allow, and kernels whose local memory ptxas chose well below it."""
    binary = compile_binary(src.source, arch=src.compile_arch, name=src.filename)
    blocks = {launch.kernel: launch.block[0] * launch.block[1] * launch.block[2]
              for launch in (src.main, src.reduce) if launch is not None}
    capped, chosen = [], []
    for k in read_cubin(binary, find_cuobjdump()).values():
        if not k.local:
            continue
        cap = min(255, 65536 // blocks.get(k.name, 1024) // 8 * 8)  # what the launch bounds allow
        line = f"{k.name}: {k.local} local-memory accesses at {k.registers} of {cap} registers"
        (capped if k.registers >= cap - 8 else chosen).append(line)
    return capped, chosen


def _hip_findings(src: KernelSource, tools: dict[str, str]) -> tuple[list[str], list[str]]:
    """clang's ISA, read back (convgen/tools/hip_isa.py): kernels that spill VGPRs or SGPRs or
    use scratch; a failed compile raises."""
    with tempfile.TemporaryDirectory() as folder:
        proc, _, kernels = compile_to_isa(tools, src.spec.target.arch, src.source, src.kernel_names, Path(folder))
    if proc.returncode:
        raise RuntimeError(f"clang exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    spills = [f"{k.name}: {k.num('vgpr_count')} VGPRs, {k.num('vgpr_spill_count')} VGPR and "
              f"{k.num('sgpr_spill_count')} SGPR spills, {k.num('private_segment_fixed_size')} bytes of scratch"
              for k in kernels.values() if k.uses_scratch or k.num("sgpr_spill_count")]
    missing = [f"{k.name}: not in the ISA" for k in kernels.values() if not k.present]
    if missing:
        raise RuntimeError("; ".join(missing))
    return spills, []


def one(job: tuple) -> tuple[str, str]:
    """('ok' | 'refused' | 'error' | 'spill' | 'local', a line): one layer's pass through plan,
    emit and compile.  'spill': a kernel at the register cap its launch bounds allow spilled to
    local memory (on AMD: any VGPR or SGPR spill or scratch).  'local': ptxas kept a few values
    in local memory well below that cap, its own trade for occupancy (reported, not a failure: a
    cached stack slot, no register shortage)."""
    arch, sms, seed, tools = job
    rng = random.Random(seed)
    problem, in_dtype = draw_layer(rng)
    pass_ = rng.choice(list(Pass))
    epi = draw_epilogue(rng, pass_, in_dtype)
    target = Target(arch, sms)
    where = describe(problem, pass_, epi, in_dtype)
    try:
        kp = copied_problem(problem, pass_, in_dtype, target)
        spec = make_spec(kp, pass_, target=target, epilogue=epi, in_dtype=in_dtype)
    except ValueError as e:  # a layer the library refuses, with its reason: not a finding
        return "refused", f"{where}: {e}"
    except Exception as e:  # noqa: BLE001 - every other failure is a finding
        return "error", f"{where}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    try:
        src = emit(spec)
        capped, chosen = _hip_findings(src, tools) if tools else _cuda_findings(src)
    except Exception as e:  # noqa: BLE001
        return "error", f"{where}: plan {spec.plan.brief()}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if capped:
        return "spill", f"{where}: plan {spec.plan.brief()}: " + "; ".join(capped + chosen)
    if chosen:
        return "local", f"{where}: plan {spec.plan.brief()}: " + "; ".join(chosen)
    return "ok", where


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="sm_90", help="a CUDA arch (NVRTC; sm_90 compiles the TMA kernels as sm_90a) or an "
                   "AMD one (gfx1100, gfx1201, gfx942: clang, with the toolchain scripts/setup_hip_toolchain.sh names)")
    p.add_argument("--sms", type=int, default=132, help="the target's SM or CU count (split-K and persistent grids)")
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--show-local", action="store_true", help="also print kernels with local memory below the register cap")
    args = p.parse_args(argv)
    tools = None
    if args.arch.startswith("gfx"):
        tools, why = toolchain(str(ROOT / "scripts" / "hip_ockl_shim.h"))
        if tools is None:
            print(f"compile_fuzz: the HIP toolchain is not set up ({why}); run "
                  'eval "$(scripts/setup_hip_toolchain.sh)" first, as scripts/hip_check.sh does', file=sys.stderr)
            return 2
    elif find_cuobjdump() is None:
        print("compile_fuzz: needs cuobjdump (the CUDA toolkit) to read registers and stacks", file=sys.stderr)
        return 2
    os.environ.setdefault("CONVGEN_WERROR", "1")  # a kernel NVRTC warns about is a finding too
    counts: dict[str, int] = {}
    end = time.monotonic() + args.seconds
    seed = args.seed * 1_000_003
    with ProcessPoolExecutor(args.jobs) as pool:
        while time.monotonic() < end:
            batch = [(args.arch, args.sms, seed + i, tools) for i in range(4 * args.jobs)]
            seed += len(batch)
            for status, line in pool.map(one, batch):
                counts[status] = counts.get(status, 0) + 1
                if status in ("error", "spill") or status == "local" and args.show_local:
                    print(f"{status.upper()}: {line}", flush=True)
    print("compile_fuzz:", ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), flush=True)
    return 1 if counts.get("error") or counts.get("spill") else 0


if __name__ == "__main__":
    sys.exit(main())
