"""`convgen bench`: the command line (arguments, the rows they name, the dry run) around
:mod:`.harness`, which times on the GPU, and :mod:`.report`, which writes the results.

By default every row is the same work on both sides (:data:`.rows.LABELS`); ``--fused``
adds the fused-epilogue comparison as rows of its own, reported apart."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from ...compile import gpu_unavailable_reason  # noqa: F401  (command.gpu_unavailable_reason is patched in tests)
from ...ir import Pass, Target
from ...spec import Plan
from ...suites import SUITES, get_suite
from ..cli_common import UsageError, add_shape_args, layers, select_layers
from . import harness
from .plot import plot
from ...fsio import atomic_write
from .report import default_out_dir, format_report, group, result_filename, run_tag, write_json
from .rows import FUSED, FUSED_PASSES, LABELS, RESIDUAL, RESIDUAL_PASSES, SAME, Item, computes, new_row

DEFAULT_REPS = 30
DEFAULT_WARMUP = 5
DEFAULT_HOST_CALLS = 100
DEFAULT_EAGER_CALLS = 50
DEFAULT_EAGER_TRIALS = 5


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench", conflict_handler="resolve",
        help="time convgen against cuDNN per layer and pass (needs a CUDA GPU)",
        description="Time convgen's kernels against cuDNN (PyTorch) for a built-in suite or one shape: "
                    "the same work on both sides; GPU time with L2 flushed and the host hidden, eager time per "
                    "call back to back, host cost per call; cold compile time; roofline floor. "
                    "Writes JSON to --out. See benchmarks/README.md.",
    )
    add_shape_args(p)
    p.add_argument("--suite", action="append", metavar="NAME",
                   help=f"a built-in suite ({', '.join(SUITES)}) or 'all'; repeatable")
    p.add_argument("--layers", help="only these layer names (comma-separated)")
    p.add_argument("--pass", dest="pass_", default="all", choices=("fprop", "dgrad", "wgrad", "all"))
    p.add_argument("--reps", type=int, default=DEFAULT_REPS, help=f"timed reps per side (default {DEFAULT_REPS})")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP,
                   help=f"untimed calls per side first; the first runs cuDNN's autotuning (default {DEFAULT_WARMUP})")
    p.add_argument("--host-calls", type=int, default=DEFAULT_HOST_CALLS,
                   help=f"calls timed for the host-side cost (default {DEFAULT_HOST_CALLS}; 0 skips it)")
    p.add_argument("--eager-calls", type=int, default=DEFAULT_EAGER_CALLS,
                   help=f"calls back to back per eager-time trial (default {DEFAULT_EAGER_CALLS}; 0 skips it)")
    p.add_argument("--eager-trials", type=int, default=DEFAULT_EAGER_TRIALS,
                   help=f"eager-time trials per side, interleaved; the median is reported (default {DEFAULT_EAGER_TRIALS})")
    p.add_argument("--out", default=None, help="folder for the JSON (default benchmarks/results)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw speedup per layer and pass; 'auto' puts it beside the JSON")
    p.add_argument("--no-torch", action="store_true", help="convgen alone, even if torch is installed")
    p.add_argument("--no-bias", action="store_true",
                   help="accepted for old command lines: no bias and no db is now the default (same work on both sides)")
    p.add_argument("--fused", action="store_true",
                   help="also compare the fused epilogue, reported apart from the same-work means: "
                        "fprop bias+ReLU fused vs PyTorch relu(conv2d(x, w, b)); wgrad dW+db on both sides")
    p.add_argument("--residual", action="store_true",
                   help="also compare the residual epilogue, reported apart: fprop bias+residual+ReLU fused "
                        "vs PyTorch relu(conv2d(x, w, b) + r)")
    p.add_argument("--no-compile-time", action="store_true",
                   help="skip the cold/warm compile timing (uses the normal kernel cache; faster)")
    p.add_argument("--json-only", action="store_true", help="print only the JSON path, no table")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--commit", default=None,
                   help="the commit to name the results by where this is not a git checkout "
                        "(default: $CONVGEN_BENCH_COMMIT, else git)")
    p.add_argument("--dry-run", action="store_true",
                   help="list the rows, FLOPs, bytes and plans (for sm_90, 132 SMs) without a GPU")
    p.set_defaults(func=cmd_bench)


def resolve_items(args: argparse.Namespace) -> tuple[list[str], list[Item]]:
    """(suite names, rows of work) from the arguments; UsageError for a bad combination."""
    shape = [getattr(args, n, None) for n in (*"nhwckrs", "groups")]
    suites: list[str] = []
    for name in args.suite or []:
        for part in name.split(","):
            part = part.strip()
            if not part:
                continue
            for s in (list(SUITES) if part == "all" else [part]):
                get_suite(s)  # ValueError naming the suites if unknown
                if s not in suites:
                    suites.append(s)
    if suites and any(v is not None for v in shape):
        raise UsageError("give either --suite or a single shape (-n -h -w -c -k -r -s), not both")
    if suites:
        groups = [(s, list(get_suite(s))) for s in suites]
    else:
        ns = argparse.Namespace(**{**vars(args), "suite": None})
        groups = [("shape", layers(ns))]
    if args.layers:
        kept = {id(l) for l in select_layers([l for _, ls in groups for l in ls], args.layers)}
        groups = [(s, [l for l in ls if id(l) in kept]) for s, ls in groups]
    passes = list(Pass) if args.pass_ == "all" else [Pass.parse(args.pass_)]
    fused = getattr(args, "fused", False)
    items = []
    for s, ls in groups:
        for l in ls:  # a layer's rows stay together: they share one data set
            items += [Item(s, l, p) for p in passes]
            if fused:
                items += [Item(s, l, p, FUSED) for p in passes if p in FUSED_PASSES]
            if getattr(args, "residual", False):
                items += [Item(s, l, p, RESIDUAL) for p in passes if p in RESIDUAL_PASSES]
    if not items:
        raise UsageError("nothing to run")
    for name, v, low in (("--reps", args.reps, 1), ("--warmup", args.warmup, 0), ("--host-calls", args.host_calls, 0),
                         ("--eager-calls", args.eager_calls, 0), ("--eager-trials", args.eager_trials, 1)):
        if v < low:
            raise UsageError(f"{name} must be >= {low}, got {v}")
    return suites, items


def dry_run(items: Sequence[Item]) -> int:
    target = Target("sm_90", 132)
    rows = [new_row(it, target=target, with_cudnn=True) for it in items]
    print(f"convgen bench --dry-run: {len(rows)} rows (plans for {target.arch}, {target.sm_count} SMs); nothing is timed")
    sections = [(v, group(items, rows, v)) for v in (SAME, FUSED, RESIDUAL)]
    for variant, groups in sections:
        if not groups:
            continue
        print(f"\n{LABELS[variant]}:")
        for p in Pass:
            if any(r["pass"] == p.value for _, g in groups for r in g):
                what = computes(p, variant)
                print(f"  {p.value}: convgen {what['convgen']}\n  {' ' * len(p.value)}  cuDNN   {what['cudnn']}")
        _dry_tables(groups, "" if variant == SAME else f" {variant}")
    return 0


def _dry_tables(groups: list[tuple[str, list[dict[str, Any]]]], tag: str) -> None:
    for name, group_rows in groups:
        print(f"\n== {name}{tag} ==")
        hdr = ("layer", "pass", "GFLOP", "MB", "GEMM m x n x k", "plan", "key")
        body = []
        for r in group_rows:
            pl = r["convgen"]["plan"]
            plan_s = Plan.from_dict(pl).brief() if pl else (r["convgen"]["error"] or "-")
            g = r["gemm"]
            body.append((r["layer"], r["pass"], f"{r['flops'] / 1e9:.2f}", f"{r['bytes'] / 1e6:.1f}",
                         f"{g['m']} x {g['n']} x {g['k']}", plan_s, r["convgen"]["key"] or "-"))
        widths = [max([len(h)] + [len(b[i]) for b in body]) for i, h in enumerate(hdr)]
        for cells in [hdr] + body:
            print("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())


def cmd_bench(args: argparse.Namespace) -> int:
    suites, items = resolve_items(args)
    if args.dry_run:
        return dry_run(items)
    reason = gpu_unavailable_reason()
    if reason is not None:
        print(f"convgen bench: no CUDA GPU ({reason})", file=sys.stderr)
        return 1
    from ...compile import DeviceError

    try:
        result = harness.run_bench(args, suites, items)
    except DeviceError as exc:  # a GPU convgen does not support, or none usable after all
        print(f"convgen bench: no CUDA GPU ({exc})", file=sys.stderr)
        return 1
    tag = run_tag(suites, [it.layer for it in items])
    out_dir = Path(args.out) if args.out else default_out_dir()
    name = result_filename(result["gpu"]["name"] or "gpu", result["date"], result["git"]["commit"], tag)
    path = write_json(result, out_dir, name)
    report = format_report(result)
    atomic_write(path.with_suffix(".txt"), report)
    if args.plot:
        plot_path = path.with_suffix(".png") if args.plot == "auto" else Path(args.plot)
        try:
            plot(result, plot_path)
            print(f"plot: {plot_path}", file=sys.stderr)
        except ImportError as exc:
            print(f"convgen bench: --plot needs matplotlib ({exc}); no plot drawn", file=sys.stderr)
    if not args.json_only:
        print(report, end="")
        print(f"\nJSON: {path}")
    else:
        print(path)
    return 0
