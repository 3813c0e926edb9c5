#!/usr/bin/env python3
"""Plan, emit and inspect the kernel convgen would generate for your own conv2d shape.

No GPU, CuPy or compiler is needed: planning and emission are pure Python, which
is the point of this example -- you can see what convgen decides for a shape,
and why, before you ever run it.  It prints

  * the problem and its implicit-GEMM view,
  * the plan, with the planner's reason for every choice,
  * the launch configuration (grid for your batch, block, shared memory, and
    the split-K reduction and workspace when there is one),
  * the first lines of the generated source, and the file it wrote.

    python3 examples/emit_and_inspect.py                       # a ResNet-50 3x3 layer
    python3 examples/emit_and_inspect.py --batch 256 --height 32 --width 32 \\
        --in-channels 3 --out-channels 32 --kernel 3 --padding same --pass wgrad
    python3 examples/emit_and_inspect.py --arch sm_80 --sm-count 108 --out-dtype float32

The same source is what ``convgen.conv2d`` compiles with NVRTC at run time
(on the device's own arch and SM count); ``convgen emit`` writes it for whole suites.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

# Run from a checkout without installing: put the repository root on the path.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from convgen import emit, make_spec  # noqa: E402
from convgen.ir import ARCHES, ConvProblem, Epilogue, Pass, Target  # noqa: E402


def pair(text: str) -> tuple[int, int]:
    """'3' -> (3, 3); '3,5' -> (3, 5): (height, width), as PyTorch takes them."""
    try:
        parts = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or H,W, got {text!r}") from None
    if len(parts) not in (1, 2):
        raise argparse.ArgumentTypeError(f"expected N or H,W, got {text!r}")
    return (parts[0], parts[-1])


def padding_arg(text: str):
    return text if text in ("same", "valid") else pair(text)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    shape = p.add_argument_group("shape (NHWC activations, KRSC weights)")
    shape.add_argument("--batch", type=int, default=32, help="N: sizes the grid and split-K, not the kernel")
    shape.add_argument("--height", type=int, default=56, help="H")
    shape.add_argument("--width", type=int, default=56, help="W")
    shape.add_argument("--in-channels", type=int, default=64, help="C")
    shape.add_argument("--out-channels", type=int, default=64, help="K")
    shape.add_argument("--kernel", type=pair, default=(3, 3), help="R,S (or one size)")
    shape.add_argument("--stride", type=pair, default=(1, 1), help="N or H,W")
    shape.add_argument("--padding", type=padding_arg, default=(1, 1), help="N, H,W, 'same' or 'valid'")
    shape.add_argument("--dilation", type=pair, default=(1, 1), help="N or H,W")
    gen = p.add_argument_group("kernel")
    gen.add_argument("--pass", dest="pass_", choices=[x.value for x in Pass], default="fprop")
    gen.add_argument("--arch", choices=sorted(ARCHES), default="sm_90")
    gen.add_argument("--sm-count", type=int, help="SMs (or CUs) for split-K sizing; default: a typical part")
    gen.add_argument("--in-dtype", choices=("float16", "float32"), default="float16")
    gen.add_argument("--out-dtype", choices=("float16", "float32"), default="float16")
    gen.add_argument("--no-bias", action="store_true", help="fprop without bias add, wgrad without db")
    gen.add_argument("--relu", action="store_true", help="fused ReLU (fprop only)")
    out = p.add_argument_group("output")
    out.add_argument("--lines", type=int, default=40, help="how many source lines to print")
    out.add_argument("-o", "--out-dir", type=Path, default=Path(tempfile.gettempdir()) / "convgen-examples",
                     help="where to write the source")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    pass_ = Pass.parse(args.pass_)
    try:
        r, s = args.kernel
        problem = ConvProblem.create(args.batch, args.height, args.width, args.in_channels, args.out_channels,
                                     r, s, stride=args.stride, padding=args.padding, dilation=args.dilation)
        epilogue = Epilogue(bias=not args.no_bias and pass_ is not Pass.DGRAD,
                            relu=args.relu and pass_ is Pass.FPROP, out_dtype=args.out_dtype)
        target = Target(args.arch, args.sm_count)
        spec = make_spec(problem, pass_, target=target, epilogue=epilogue, in_dtype=args.in_dtype)
    except ValueError as exc:  # a bad shape or option: one line, not a traceback
        print(f"emit_and_inspect: {exc}", file=sys.stderr)
        return 2
    src = emit(spec)
    n = problem.n
    gemm = problem.gemm(pass_)

    print(f"== problem: {problem.describe()}")
    print(f"   x {problem.x_shape} (NHWC), w {problem.w_shape} (KRSC), y {problem.y_shape} (NPQK)")
    print(f"   {pass_.value}: GEMM M={gemm.m} ({gemm.m_axis}) x N={gemm.n} ({gemm.n_axis}) "
          f"x K={gemm.k} ({gemm.k_axis}), {gemm.flops / 1e9:.3f} GFLOP")
    print(f"   target {target.arch} ({target.backend}, {target.sm_count} SMs), epilogue "
          f"bias={epilogue.bias} relu={epilogue.relu} out={epilogue.out_dtype}, in_dtype {spec.in_dtype}")

    print("\n== plan (and why)")
    print("   " + spec.plan.explain().replace("\n", "\n   "))

    print("\n== launch")
    main_ = src.main
    print(f"   kernel  {main_.kernel}")
    print(f"   args    ({', '.join(main_.args)})")
    print(f"   grid    {src.grid(n)} for N={n}  (x = ceil(M / {main_.grid_m_tile}), "
          f"y = N tiles, z = split-K slices)")
    print(f"   block   {main_.block}  ({main_.block[0] // target.warp_size} warps)")
    print(f"   dynamic shared memory {main_.shared_mem} bytes"
          + ("  (> 48 KiB: the launcher opts in)" if main_.shared_mem > 48 * 1024 else ""))
    if src.reduce is not None:
        red = src.reduce
        print(f"   split-K reduction  {red.kernel}")
        print(f"           args ({', '.join(red.args)}), grid ({red.grid_x(n)}, 1, 1) = "
              f"ceil({gemm.m * gemm.n} outputs / {red.grid_m_tile} per block), block {red.block}")
        print(f"           fp32 workspace {src.workspace_elems(n)} elements = {src.workspace_elems(n) * 4 / 2**20:.2f} MiB")
    else:
        print("   no split-K: one launch, no workspace")

    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / src.filename
    path.write_text(src.source)
    lines = src.source.splitlines()
    print(f"\n== source: first {min(args.lines, len(lines))} of {len(lines)} lines")
    for i, line in enumerate(lines[: args.lines], 1):
        print(f"{i:4d}  {line}")
    print(f"\n== wrote {path}  (spec key {spec.key})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
