"""The `convgen` command: emit, plan and list suites (bench, tune and sass live in their own modules).

Bad user input ends in one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Callable, Iterable, NoReturn, Sequence

from .ir import ARCHES, ConvProblem, Epilogue, Pass, Target
from .suites import SUITES, Layer, get_suite

DEFAULT_ARCH = {"cuda": "sm_90", "hip": "gfx1201"}


class UsageError(ValueError):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse with convgen's error format: a usage error (unknown option, bad choice,
    missing -o) is one line, `convgen: error: ...`, and exit status 2, like every other
    input error, instead of argparse's usage block.  Subparsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        sub = self.prog.split(" ", 1)[1] if " " in self.prog else ""
        where = f"{sub}: " if sub else ""
        self.exit(2, f"convgen: error: {where}{message} (see `{self.prog} --help`)\n")


def _pair(text: str) -> tuple[int, int]:
    try:
        parts = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or H,W, got {text!r}") from None
    if len(parts) == 1:
        return (parts[0], parts[0])
    if len(parts) == 2:
        return (parts[0], parts[1])
    raise argparse.ArgumentTypeError(f"expected N or H,W, got {text!r}")


def _add_shape_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("shape (instead of --suite)")
    g.add_argument("--suite", help="a built-in suite (see `convgen suites`)")
    for name, help_ in (("n", "batch size"), ("h", "input height"), ("w", "input width"),
                        ("c", "input channels"), ("k", "output channels"), ("r", "filter height"),
                        ("s", "filter width")):
        g.add_argument(f"-{name}", type=int, dest=name, help=help_)
    g.add_argument("--stride", type=_pair, default=(1, 1), help="N or H,W (default 1)")
    g.add_argument("--padding", default="0", help="N, H,W, 'same' or 'valid' (default 0)")
    g.add_argument("--dilation", type=_pair, default=(1, 1), help="N or H,W (default 1)")


def _add_target_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=("cuda", "hip"), help="default: cuda, or the backend of --arch")
    p.add_argument("--arch", choices=sorted(ARCHES), help="default: sm_90 (cuda) or gfx1201 (hip)")
    p.add_argument("--sm-count", type=int, help="SMs / CUs for split-K sizing (default: a typical part of the arch)")
    p.add_argument("--pass", dest="pass_", default="all", choices=("fprop", "dgrad", "wgrad", "all"))
    p.add_argument("--in-dtype", default="float16", choices=("float16", "float32"))
    p.add_argument("--out-dtype", default="float16", choices=("float16", "float32"))
    p.add_argument("--no-bias", action="store_true", help="fprop without bias, wgrad without db")
    p.add_argument("--relu", action="store_true", help="fused ReLU in fprop")


def _target(args: argparse.Namespace) -> Target:
    arch = args.arch or DEFAULT_ARCH[args.backend or "cuda"]
    if args.backend and ARCHES[arch].backend != args.backend:
        raise UsageError(f"--arch {arch} is a {ARCHES[arch].backend} target, not {args.backend}")
    return Target(arch, args.sm_count)


def _layers(args: argparse.Namespace) -> list[Layer]:
    shape = [args.n, args.h, args.w, args.c, args.k, args.r, args.s]
    if args.suite:
        if any(v is not None for v in shape):
            raise UsageError("give either --suite or a single shape (-n -h -w -c -k -r -s), not both")
        return list(get_suite(args.suite))
    missing = [f"-{n}" for n, v in zip("nhwckrs", shape) if v is None]
    if missing:
        raise UsageError(f"give --suite NAME or a full shape; missing {' '.join(missing)}")
    padding: object = args.padding
    if args.padding not in ("same", "valid"):
        try:
            padding = _pair(args.padding)
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"--padding: {exc}") from None
    problem = ConvProblem.create(*shape, stride=args.stride, padding=padding, dilation=args.dilation)  # type: ignore[arg-type]
    return [Layer("conv", problem)]


def _passes(args: argparse.Namespace) -> list[Pass]:
    return list(Pass) if args.pass_ == "all" else [Pass.parse(args.pass_)]


def _epilogue(args: argparse.Namespace, pass_: Pass) -> Epilogue:
    return Epilogue(
        bias=not args.no_bias and pass_ is not Pass.DGRAD,
        relu=args.relu and pass_ is Pass.FPROP,
        out_dtype=args.out_dtype,
    )


def _specs(args: argparse.Namespace) -> Iterable[tuple[Layer, Pass, "object"]]:
    from .planner import make_spec

    target = _target(args)
    for layer in _layers(args):
        for pass_ in _passes(args):
            yield layer, pass_, make_spec(layer.problem, pass_, target=target,
                                          epilogue=_epilogue(args, pass_), in_dtype=args.in_dtype)


def cmd_emit(args: argparse.Namespace) -> int:
    from .emit import emit

    out = Path(args.output)
    # Plan and render everything first: bad input then writes nothing, not half a folder.
    rendered = [(layer, pass_, emit(spec)) for layer, pass_, spec in _specs(args)]  # type: ignore[arg-type]
    out.mkdir(parents=True, exist_ok=True)
    manifest = []
    for layer, pass_, src in rendered:
        filename = f"{layer.name}.{pass_.value}.{src.filename.rsplit('.', 1)[1]}"
        (out / filename).write_text(src.source)
        entry = src.manifest_entry()
        entry.update(file=filename, layer=layer.name, batch=layer.problem.n)
        manifest.append(entry)
        if not args.quiet:
            print(f"{out / filename}  {src.main.kernel}")
    (out / "manifest.json").write_text(json.dumps({"kernels": manifest}, indent=2, sort_keys=True) + "\n")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    rows = []
    for layer, pass_, spec in _specs(args):
        plan = spec.plan  # type: ignore[attr-defined]
        if args.json:
            rows.append({"layer": layer.name, "pass": pass_.value, "problem": layer.problem.as_dict(),
                         "plan": plan.as_dict(), "reasons": list(plan.reasons), "key": spec.key})  # type: ignore[attr-defined]
        else:
            print(f"{layer.name} {pass_.value}: {layer.problem.describe()}")
            print("  " + plan.explain().replace("\n", "\n  "))
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
    return 0


def cmd_suites(args: argparse.Namespace) -> int:
    for name, layers in SUITES.items():
        print(f"{name} ({len(layers)} layers)")
        for layer in layers:
            print(f"  {layer.name:<14} {layer.problem.describe()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="convgen", description="conv2d kernels specialised to one shape")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("emit", help="write kernel sources and a manifest.json", conflict_handler="resolve")
    _add_shape_args(p)
    _add_target_args(p)
    p.add_argument("-o", "--output", required=True, help="output directory")
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(func=cmd_emit)

    p = sub.add_parser("plan", help="show the plan and the reason for each choice", conflict_handler="resolve")
    _add_shape_args(p)
    _add_target_args(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("suites", help="list the built-in suites and their layers")
    p.set_defaults(func=cmd_suites)

    for module in ("convgen.bench", "convgen.tune", "convgen.sass", "convgen.cache_cmd"):  # commands that live in their own modules
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        mod.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status (0, or 2 for bad input), never raises SystemExit."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, already reported on stderr)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except (ValueError, OSError) as exc:
        print(f"convgen: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
