"""What every `convgen` command shares: the usage error, shape and target arguments, and
turning them into layers, passes, targets and epilogues.

The commands (`convgen.cli` and the tools' own modules) import these by name, so none of
them reaches into another command's private helpers.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from ..ir import ARCHES, ConvProblem, Epilogue, Pass, Target
from ..suites import Layer, get_suite

DEFAULT_ARCH = {"cuda": "sm_90", "hip": "gfx1201"}


class UsageError(ValueError):
    """Bad command-line input: `convgen` prints it on one line and exits with status 2."""


def pair(text: str) -> tuple[int, int]:
    try:
        parts = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or H,W, got {text!r}") from None
    if len(parts) == 1:
        return (parts[0], parts[0])
    if len(parts) == 2:
        return (parts[0], parts[1])
    raise argparse.ArgumentTypeError(f"expected N or H,W, got {text!r}")


def add_shape_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("shape (instead of --suite)")
    g.add_argument("--suite", help="a built-in suite (see `convgen suites`)")
    for name, help_ in (("n", "batch size"), ("h", "input height"), ("w", "input width"),
                        ("c", "input channels"), ("k", "output channels"), ("r", "filter height"),
                        ("s", "filter width")):
        g.add_argument(f"-{name}", type=int, dest=name, help=help_)
    g.add_argument("--stride", type=pair, default=(1, 1), help="N or H,W (default 1)")
    g.add_argument("--padding", default="0", help="N, H,W, 'same' or 'valid' (default 0)")
    g.add_argument("--dilation", type=pair, default=(1, 1), help="N or H,W (default 1)")
    g.add_argument("--groups", type=int, default=None, metavar="G",
                   help="grouped convolution as torch's conv2d(groups=G): weights (K, R, S, C/G); G = C is "
                        "depthwise (default 1)")


def add_target_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=("cuda", "hip"), help="default: cuda, or the backend of --arch")
    p.add_argument("--arch", choices=sorted(ARCHES), help="default: sm_90 (cuda) or gfx1201 (hip)")
    p.add_argument("--sm-count", type=int, help="SMs / CUs for split-K sizing (default: a typical part of the arch)")
    p.add_argument("--pass", dest="pass_", default="all", choices=("fprop", "dgrad", "wgrad", "all"))
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"),
                   help="the MMAs' 16-bit input type, fp32 accumulators either way (default float16); "
                        "the default of --in-dtype and --out-dtype")
    p.add_argument("--in-dtype", choices=("float16", "bfloat16", "float32"),
                   help="the inputs' dtype (default: --dtype); float32 is rounded to --dtype in the gather")
    p.add_argument("--out-dtype", choices=("float16", "bfloat16", "float32"), help="default: --dtype")
    p.add_argument("--no-bias", action="store_true", help="fprop without bias, wgrad without db")
    p.add_argument("--relu", action="store_true", help="fused ReLU in fprop")
    p.add_argument("--gelu", action="store_true", help="fused GELU (erf form) in fprop")
    p.add_argument("--residual", action="store_true",
                   help="fprop adds a residual of y's shape: act(alpha * conv + bias + beta * residual)")


def dtypes(args: argparse.Namespace) -> None:
    """Fill in --in-dtype and --out-dtype from --dtype where they were not given."""
    args.in_dtype = args.in_dtype or args.dtype
    args.out_dtype = args.out_dtype or args.dtype


def target(args: argparse.Namespace) -> Target:
    arch = args.arch or DEFAULT_ARCH[args.backend or "cuda"]
    if args.backend and ARCHES[arch].backend != args.backend:
        raise UsageError(f"--arch {arch} is a {ARCHES[arch].backend} target, not {args.backend}")
    return Target(arch, args.sm_count)


def layers(args: argparse.Namespace) -> list[Layer]:
    """The layers the arguments name: a suite's, or the one full shape."""
    shape = [args.n, args.h, args.w, args.c, args.k, args.r, args.s]
    groups = getattr(args, "groups", None)
    if args.suite:
        if any(v is not None for v in shape):
            raise UsageError("give either --suite or a single shape (-n -h -w -c -k -r -s), not both")
        if groups is not None:
            raise UsageError("--groups goes with a single shape; a suite's layers carry their own groups")
        return list(get_suite(args.suite))
    missing = [f"-{n}" for n, v in zip("nhwckrs", shape) if v is None]
    if missing:
        raise UsageError(f"give --suite NAME or a full shape; missing {' '.join(missing)}")
    padding: object = args.padding
    if args.padding not in ("same", "valid"):
        try:
            padding = pair(args.padding)
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"--padding: {exc}") from None
    problem = ConvProblem.create(*shape, stride=args.stride, padding=padding, dilation=args.dilation,  # type: ignore[arg-type]
                                 groups=1 if groups is None else groups)
    return [Layer("conv", problem)]


def select_layers(layers: list[Layer], names: str | None) -> list[Layer]:
    """The layers ``--layers`` names (comma-separated), in their suite's order; all without it."""
    if not names:
        return layers
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {l.name for l in layers}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise UsageError(f"--layers: no layer named {', '.join(unknown)}; these are: {', '.join(sorted(known))}")
    return [l for l in layers if l.name in wanted]


def passes(args: argparse.Namespace) -> list[Pass]:
    return list(Pass) if args.pass_ == "all" else [Pass.parse(args.pass_)]


def epilogue(args: argparse.Namespace, pass_: Pass) -> Epilogue:
    if args.relu and args.gelu:
        raise UsageError("--relu and --gelu are two activations; choose one")
    return Epilogue(
        bias=not args.no_bias and pass_ is not Pass.DGRAD,
        relu=args.relu and pass_ is Pass.FPROP,
        gelu=args.gelu and pass_ is Pass.FPROP,
        residual=args.residual and pass_ is Pass.FPROP,
        out_dtype=args.out_dtype,
    )


def as_run(problem: ConvProblem, pass_: Pass, spec: Any, in_dtype: str, mma_dtype: str) -> tuple[Any, str]:
    """The spec convgen.conv2d & co. run for ``problem`` in place of the planner's ``spec`` for
    it (a stem's channels padded first, a grouped layer's groups packed into slabs, as
    the rules in convgen/channel_pad.py and convgen/group_pack.py say), and a sentence saying
    which, empty when neither applies.  `convgen plan` explains it and `convgen sass` compiles
    it, so neither shows a kernel that never runs."""
    from ..channel_pad import kept_for_the_staged_halo, padded_channels
    from ..group_pack import packed_groups
    from ..planner import make_spec

    def respec(pack: int = 1, **changes: int) -> Any:
        return make_spec(dataclasses.replace(problem, **changes), pass_, target=spec.target, epilogue=spec.epilogue,
                         in_dtype=in_dtype, mma_dtype=mma_dtype, pack=pack)

    cp = padded_channels(problem, pass_, in_dtype, spec.target)
    if cp is not None:
        return respec(c=cp), (f"pads C={problem.c} to {cp} channels first (one copy kernel; zeros after "
                              f"{problem.c}), so the gathers read {2 * cp}-byte runs; the plan is for C={cp}")
    slabs = packed_groups(problem, pass_, in_dtype, spec.target)
    if slabs is not None:
        g = problem.groups
        wgrad = pass_ is Pass.WGRAD
        return respec(groups=slabs, pack=g // slabs if wgrad else 1), (
            (f"packs all {g} groups into one dense layer (convgen/group_pack.py): " if slabs == 1 else
             f"packs its {g} groups into {slabs} slabs of {g // slabs} ({problem.c // slabs} channels, "
             f"{problem.k // slabs} filters each; convgen/group_pack.py): ")
            + ("w copied to block-diagonal weights first" if not wgrad else
               "the kernel computes the slabs' GEMMs and stores each filter's own channels alone, no copy after")
            + f"; the plan is for groups={slabs}")
    if kept_for_the_staged_halo(problem, pass_, in_dtype, spec.target):
        return spec, ("keeps C=3 unpadded: the staged halo copies each block's whole input halo once, so padding "
                      "would only add a copy and a third more MMAs (1.19-1.35x slower on three stems: channel_pad)")
    return spec, ""
