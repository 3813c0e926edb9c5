"""The `convgen` command: emit, plan and list suites here; bench, tune and sass are the
tools' own modules (``convgen.tools``), registered below.

This module is a tool, not library: it sits at ``convgen/cli.py`` only because
``python -m convgen.cli`` and the ``convgen`` console script name it.  Bad user input ends
in one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Iterable, NoReturn, Sequence

from . import tuning_db
from .ir import ConvProblem, Pass
from .spec import Plan
from .suites import SUITE_INFO, SUITES, Layer
from .tools import cache, sass, tune
from .tools.bench import command as bench_command
from .tools.cli_common import (UsageError, add_shape_args, add_target_args, as_run, dtypes, epilogue, layers, passes,
                               target)

__all__ = ["UsageError", "build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """argparse with convgen's error format: a usage error (unknown option, bad choice,
    missing -o) is one line, `convgen: error: ...`, and exit status 2, like every other
    input error, instead of argparse's usage block.  Subparsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        sub = self.prog.split(" ", 1)[1] if " " in self.prog else ""
        where = f"{sub}: " if sub else ""
        self.exit(2, f"convgen: error: {where}{message} (see `{self.prog} --help`)\n")


def _shipped_plans(gpu: str, arch: str) -> dict[tuple[object, Pass, str], Plan]:
    """The plans the tuning database shipped for `gpu` (convgen/tuning/<gpu>.json) holds
    for `arch`, by (geometry, pass, input dtype): what convgen.conv2d runs on that GPU when
    the user has tuned nothing.  Read here, not through the tuner's lookup, so that a user's
    own database never changes what `convgen emit --tuned` writes."""
    path = tuning_db.SHIPPED_DIR / f"{tuning_db.gpu_slug(gpu)}.json"
    if not path.is_file():
        shipped = ", ".join(sorted(p.stem for p in tuning_db.SHIPPED_DIR.glob("*.json")))
        raise UsageError(f"--tuned {gpu}: no shipped tuning database {path.name} (shipped: {shipped})")
    db = json.loads(path.read_text()).get("gpus", {}).get(tuning_db.gpu_slug(gpu), {})
    plans = {}
    for key, entry in db.items():
        for dtype in ("float16", "float32"):
            geometry = ConvProblem.create(**entry["shape"]).geometry
            if tuning_db.tune_key(geometry, Pass(entry["pass"]), dtype, arch) == key:
                plans[(geometry, Pass(entry["pass"]), dtype)] = Plan.from_dict(
                    entry["plan"], geometry, Pass(entry["pass"]),
                    reasons=(f"tuned on {gpu}: {entry['us']:.1f} us vs {entry['default_us']:.1f} us planned",))
    return plans


def _specs(args: argparse.Namespace) -> Iterable[tuple[Layer, Pass, "object"]]:
    from .planner import make_spec

    tgt = target(args)
    dtypes(args)
    tuned = _shipped_plans(args.tuned, tgt.arch) if getattr(args, "tuned", None) else None
    for layer in layers(args):
        for pass_ in passes(args):
            plan_ = None
            if tuned is not None:
                plan_ = tuned.get((layer.problem.geometry, pass_, args.in_dtype))
                if plan_ is None:
                    continue  # `--tuned`: only the kernels the database runs
            yield layer, pass_, make_spec(layer.problem, pass_, target=tgt, epilogue=epilogue(args, pass_),
                                          in_dtype=args.in_dtype, plan_=plan_, mma_dtype=args.dtype)


def cmd_emit(args: argparse.Namespace) -> int:
    from .emit import emit
    from .resources import device_headers, include_dir

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
    # The kernels include "convgen/device.h" (and TMA kernels "convgen/hopper.h"): a copy of
    # each header some kernel includes, next to them, compiles with `nvcc -I DIR`.
    headers = []
    for rel in device_headers():
        if not any(f'#include "{rel.as_posix()}"' in src.source for _, _, src in rendered):
            continue
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes((include_dir() / rel).read_bytes())
        headers.append(rel.as_posix())
    (out / "manifest.json").write_text(
        json.dumps({"kernels": manifest, "headers": headers, "include_dir": "."}, indent=2, sort_keys=True) + "\n"
    )
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    rows = []
    for layer, pass_, spec in _specs(args):
        padded = ""
        if not getattr(args, "tuned", None):  # what convgen.conv2d & co. run: a stem padded, groups packed
            spec, padded = as_run(layer.problem, pass_, spec, args.in_dtype, args.dtype)
        plan, g = spec.plan, spec.geometry  # type: ignore[attr-defined]
        cp = g.c if g.c != layer.problem.c else None
        slabs = g.groups if g.groups != layer.problem.groups else None
        if args.json:
            rows.append({"layer": layer.name, "pass": pass_.value, "problem": layer.problem.as_dict(),
                         "plan": plan.as_dict(), "reasons": ([padded] if padded else []) + list(plan.reasons),
                         "padded_channels": cp, "packed_groups": slabs, "key": spec.key})  # type: ignore[attr-defined]
        else:
            print(f"{layer.name} {pass_.value}: {layer.problem.describe()}")
            if padded:
                print("  " + padded)
            print("  " + plan.explain().replace("\n", "\n  "))
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
    return 0


def cmd_suites(args: argparse.Namespace) -> int:
    for name, suite in SUITES.items():
        print(f"{name} ({len(suite)} layers): {SUITE_INFO[name].source}")
        for layer in suite:
            print(f"  {layer.name:<14} {layer.problem.describe()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="convgen", description="conv2d kernels specialised to one shape")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("emit", help="write kernel sources and a manifest.json", conflict_handler="resolve")
    add_shape_args(p)
    add_target_args(p)
    p.add_argument("-o", "--output", required=True, help="output directory")
    p.add_argument("--tuned", metavar="GPU",
                   help="only the layers the tuning database shipped for GPU (e.g. nvidia-h200) holds, with its plans")
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(func=cmd_emit)

    p = sub.add_parser("plan", help="show the plan and the reason for each choice", conflict_handler="resolve")
    add_shape_args(p)
    add_target_args(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("suites", help="list the built-in suites and their layers")
    p.set_defaults(func=cmd_suites)

    for command in (bench_command, tune, sass, cache):  # the tools' commands
        command.add_parser(sub)
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
