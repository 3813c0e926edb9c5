"""`convgen bench`: convgen's kernels against cuDNN, layer by layer and pass by pass.

For every layer of a built-in suite (or one shape) and every pass, in one process:

* the GPU time of convgen's call and of cuDNN's (PyTorch, fp16, channels_last,
  ``torch.backends.cudnn.benchmark = True``) on the *same* device memory (torch makes
  the data, CuPy reads it through DLPack, zero-copy), both with fp16 outputs;
* the host-side cost of one call (wall clock per call while the GPU is held busy,
  so no GPU work is in it), for both;
* convgen's cold compile time (plan + emit + NVRTC + load, fresh disk cache) and its
  warm-disk-cache time; cuDNN's first call (its autotuning) for comparison;
* the roofline floor of the layer from ceilings measured in the same run:
  max(FLOPs / fp16-GEMM rate, bytes / device-copy bandwidth).

Timing method (see benchmarks/README.md): CUDA events around only the op, one pair
per rep; before every rep a short spin kernel (so the host is always ahead of the
GPU and no launch gap is timed) and a 256 MiB write that flushes L2; reps of convgen
and cuDNN interleaved (A B A B ...); the median is reported.  ``triton.testing.do_bench``
is not used: it times one function at a time (no interleaving), and torch/triton
would then be needed even for a convgen-only run.

Layout: the pure parts (traffic, floor, statistics, summaries, table, file naming,
JSON, CLI) are plain functions that run on any machine and are unit-tested on the
CPU; the GPU parts are confined to :class:`CudaDevice`, :class:`Session` and
:func:`run_bench`.  Nothing here imports CuPy or torch at module import time.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

from .cli import UsageError, _add_shape_args, _layers
from .compile import gpu_unavailable_reason  # noqa: F401  (bench.gpu_unavailable_reason is patched in tests)
from .ir import ConvProblem, Epilogue, Pass, Plan, Target
from .suites import SUITES, Layer, get_suite

RESULT_FORMAT = 1
TOLERANCE = 1e-2  # norm-relative difference allowed between convgen's and cuDNN's outputs
L2_FLUSH_BYTES = 256 << 20
GEMM_SIZE = 8192
COPY_BYTES = 2 << 30
DEFAULT_REPS = 30
DEFAULT_WARMUP = 5
DEFAULT_HOST_CALLS = 100
MIN_SPIN_US = 20.0  # per-rep spin before the flush: keeps the GPU queue ahead of the host

_BYTES = {"float16": 2, "float32": 4}


def _repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def default_out_dir() -> Path:
    root = _repo_root()
    return root / "benchmarks" / "results" if (root / "benchmarks").is_dir() else Path("benchmarks") / "results"


# =========================================================================== pure parts


@dataclass(frozen=True)
class Item:
    """One row of work: a layer of a suite and a pass."""

    suite: str
    layer: Layer
    pass_: Pass

    @property
    def label(self) -> str:
        return f"{self.suite}/{self.layer.name} {self.pass_.value}"


def traffic(problem: ConvProblem, pass_: Pass | str, *, bias: bool = True, in_dtype: str = "float16",
            out_dtype: str = "float16", bias_dtype: str = "float32") -> dict[str, int]:
    """Bytes each tensor of one pass moves at the least: every input read once, every
    output written once.  fprop reads x, w (and the bias, fp32 as convgen reads it) and
    writes y; dgrad reads dy, w and writes dx; wgrad reads x, dy and writes dw (and db).
    Split-K workspaces and re-reads are implementation costs and are not counted."""
    p = Pass.parse(pass_)
    i, o = _BYTES[in_dtype], _BYTES[out_dtype]
    n, h, w, c = problem.x_shape
    _, pp, q, k = problem.y_shape
    x = n * h * w * c
    y = n * pp * q * k
    wt = k * problem.r * problem.s * c
    if p is Pass.FPROP:
        t = {"x": x * i, "w": wt * i}
        if bias:
            t["bias"] = k * _BYTES[bias_dtype]
        t["y"] = y * o
        return t
    if p is Pass.DGRAD:
        return {"dy": y * i, "w": wt * i, "dx": x * o}
    t = {"x": x * i, "dy": y * i, "dw": wt * o}
    if bias:
        t["db"] = k * o
    return t


def useful_flops(problem: ConvProblem) -> int:
    """2 * N*P*Q * K * R*S*C: the multiply-adds of the convolution, the same for all three
    passes (each forward product has one counterpart in dgrad and one in wgrad).  This is
    what TFLOP/s and the floor use.  convgen's implicit GEMM of dgrad (M = N*H*W, K = R*S*K)
    is larger when stride > 1, as it spans filter taps that land between output pixels;
    that size is kept in the JSON as ``gemm_flops``."""
    return problem.flops(Pass.FPROP)


def pass_bytes(problem: ConvProblem, pass_: Pass | str, **kw: Any) -> int:
    return sum(traffic(problem, pass_, **kw).values())


def floor_us(flops: float, nbytes: float, gemm_tflops: Optional[float],
             copy_gbps: Optional[float]) -> tuple[Optional[float], Optional[str]]:
    """The roofline floor in microseconds and what bounds it ("compute" or "memory"):
    max(flops / GEMM rate, bytes / copy bandwidth).  (None, None) without both ceilings."""
    if not gemm_tflops or not copy_gbps or gemm_tflops <= 0 or copy_gbps <= 0:
        return None, None
    compute = flops / (gemm_tflops * 1e6)  # TFLOP/s = 1e6 FLOP/us
    memory = nbytes / (copy_gbps * 1e3)  # GB/s = 1e3 B/us
    return (compute, "compute") if compute >= memory else (memory, "memory")


def tflops(flops: float, us: Optional[float]) -> Optional[float]:
    return None if not us or us <= 0 else flops / (us * 1e6)


def ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    if num is None or den is None or den <= 0 or num <= 0:
        return None
    return num / den


def geomean(values: Iterable[Optional[float]]) -> Optional[float]:
    """Geometric mean of the positive finite values; None when there are none."""
    vals = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def _quantile(sorted_vals: Sequence[float], q: float) -> float:
    if len(sorted_vals) == 1:
        return sorted_vals[0]
    pos = q * (len(sorted_vals) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def time_stats(samples_us: Sequence[float]) -> Optional[dict[str, Any]]:
    """Median and spread of per-rep times (microseconds); None for no samples."""
    vals = sorted(float(v) for v in samples_us)
    if not vals:
        return None
    return {
        "median": statistics.median(vals), "min": vals[0], "max": vals[-1],
        "p20": _quantile(vals, 0.2), "p80": _quantile(vals, 0.8),
        "mean": statistics.fmean(vals), "n": len(vals),
    }


def _median_of(stats: Optional[dict[str, Any]]) -> Optional[float]:
    return None if not stats else stats.get("median")


def mismatch(row: dict[str, Any]) -> bool:
    check = row.get("check")
    return bool(check) and check.get("ok") is False


def finish_row(row: dict[str, Any], ceilings: dict[str, Any]) -> dict[str, Any]:
    """Fill the derived fields of a row (floor, TFLOP/s, speedup, time over floor) from
    its measured times and the run's ceilings.  Derived values are None when an input is."""
    fl, bound = floor_us(row["flops"], row["bytes"], ceilings.get("gemm_tflops"), ceilings.get("copy_gbps"))
    row["floor_us"], row["floor_bound"] = fl, bound
    cg = _median_of(row["convgen"].get("time_us"))
    row["convgen"]["tflops"] = tflops(row["flops"], cg)
    cd = None
    if row.get("cudnn") is not None:
        cd = _median_of(row["cudnn"].get("time_us"))
        row["cudnn"]["tflops"] = tflops(row["flops"], cd)
    row["speedup"] = ratio(cd, cg)  # > 1: convgen is faster
    row["over_floor"] = ratio(cg, fl)  # >= 1 normally: how far from the floor
    return row


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Geometric means per pass and over all rows.  Rows whose output did not match
    cuDNN's are left out of every mean (their time is not of a correct kernel)."""
    passes = [p.value for p in Pass if any(r["pass"] == p.value for r in rows)]
    out: dict[str, Any] = {"speedup": {}, "over_floor": {}, "convgen_tflops": {}, "count": {},
                           "excluded_mismatch": sum(1 for r in rows if mismatch(r))}
    for key in passes + ["all"]:
        sel = [r for r in rows if (key == "all" or r["pass"] == key) and not mismatch(r)]
        out["speedup"][key] = geomean(r.get("speedup") for r in sel)
        out["over_floor"][key] = geomean(r.get("over_floor") for r in sel)
        out["convgen_tflops"][key] = geomean(r["convgen"].get("tflops") for r in sel)
        out["count"][key] = sum(1 for r in sel if r.get("speedup") is not None)

    def med(side: str, field: str, fn: Callable[[list[float]], float] = statistics.median) -> Optional[float]:
        vals = [r[side][field] for r in rows if r.get(side) and r[side].get(field) is not None]
        return fn(vals) if vals else None

    out["costs"] = {
        "convgen_host_us_median": med("convgen", "host_us"),
        "cudnn_host_us_median": med("cudnn", "host_us"),
        "compile_cold_ms_median": med("convgen", "compile_cold_ms"),
        "compile_cold_ms_max": med("convgen", "compile_cold_ms", max),
        "compile_warm_ms_median": med("convgen", "compile_warm_ms"),
        "cudnn_first_call_ms_median": med("cudnn", "first_call_ms"),
    }
    return out


# --------------------------------------------------------------------------- text output


def _f(v: Optional[float], fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _us(v: Optional[float]) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def row_note(row: dict[str, Any]) -> str:
    notes = []
    if mismatch(row):
        notes.append(f"MISMATCH err={row['check']['rel_err']:.1e}")
    if row["convgen"].get("error"):
        notes.append("convgen error")
    if row.get("cudnn") and row["cudnn"].get("error"):
        notes.append("cudnn error")
    return "; ".join(notes)


TABLE_COLUMNS = ("layer", "pass", "convgen us", "cuDNN us", "TFLOP/s", "speedup", "floor us",
                 "/floor", "host us", "note")


def table_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """An aligned plain-text table of rows (ASCII only: 'us' is microseconds)."""
    body = []
    for r in rows:
        cd = r.get("cudnn") or {}
        body.append((
            r["layer"], r["pass"],
            _us(_median_of(r["convgen"].get("time_us"))),
            _us(_median_of(cd.get("time_us"))),
            _f(r["convgen"].get("tflops"), ".1f"),
            _f(r.get("speedup"), ".2f") + ("x" if r.get("speedup") is not None else ""),
            _us(r.get("floor_us")),
            _f(r.get("over_floor"), ".2f"),
            _us(r["convgen"].get("host_us")),
            row_note(r),
        ))
    widths = [max([len(h)] + [len(b[i]) for b in body]) for i, h in enumerate(TABLE_COLUMNS)]
    left = {0, 1, len(TABLE_COLUMNS) - 1}

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(TABLE_COLUMNS), line(["-" * w for w in widths])] + [line(b) for b in body]


def summary_lines(summary: dict[str, Any]) -> list[str]:
    keys = list(summary["speedup"])
    lines = []
    for name, field, fmt, suffix in (
        ("geomean speedup (cuDNN/convgen)", "speedup", ".2f", "x"),
        ("geomean convgen/floor", "over_floor", ".2f", ""),
        ("geomean convgen TFLOP/s", "convgen_tflops", ".1f", ""),
    ):
        parts = [f"{k} {_f(summary[field][k], fmt)}{suffix if summary[field][k] is not None else ''}" for k in keys]
        lines.append(f"{name}: " + ", ".join(parts))
    c = summary.get("costs") or {}
    if any(v is not None for v in c.values()):
        lines.append(
            f"host per call (median): convgen {_us(c.get('convgen_host_us_median'))} us, "
            f"cuDNN {_us(c.get('cudnn_host_us_median'))} us; convgen compile: cold median "
            f"{_f(c.get('compile_cold_ms_median'), '.0f')} ms (max {_f(c.get('compile_cold_ms_max'), '.0f')}), "
            f"warm disk {_f(c.get('compile_warm_ms_median'), '.1f')} ms; cuDNN first call (autotune) "
            f"{_f(c.get('cudnn_first_call_ms_median'), '.0f')} ms"
        )
    if summary.get("excluded_mismatch"):
        lines.append(f"({summary['excluded_mismatch']} row(s) left out of the means: output mismatch)")
    return lines


def format_report(result: dict[str, Any]) -> str:
    out: list[str] = []
    ce = result.get("ceilings") or {}
    gpu = (result.get("gpu") or {}).get("name") or "?"
    out.append(
        f"convgen bench on {gpu}: GEMM ceiling {_f(ce.get('gemm_tflops'), '.1f')} TFLOP/s, "
        f"copy ceiling {_f(ce.get('copy_gbps'), '.0f')} GB/s; medians of {result['settings'].get('reps')} reps, "
        "L2 flushed, convgen/cuDNN interleaved"
    )
    for note in result.get("notes", []):
        out.append(f"note: {note}")
    for suite in result["suites"]:
        out.append("")
        out.append(f"== {suite['name']} ({len(suite['rows'])} rows) ==")
        out.extend(table_lines(suite["rows"]))
        out.extend(summary_lines(suite["summary"]))
    if len(result["suites"]) > 1 and result.get("summary"):
        out.append("")
        out.append("== all suites ==")
        out.extend(summary_lines(result["summary"]))
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- files


def slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return s or "unknown"


def run_tag(suites: Sequence[str], layers: Sequence[Layer] | None = None) -> str:
    """The suffix naming what was run: one suite's name, 'all', names joined by '+',
    or 'shape-…' for a single shape."""
    if not suites and layers:
        p = layers[0].problem
        return (f"shape-n{p.n}-{p.h}x{p.w}-c{p.c}-k{p.k}-{p.r}x{p.s}"
                f"-s{p.stride[0]}{p.stride[1]}-p{p.padding[0]}{p.padding[1]}-d{p.dilation[0]}{p.dilation[1]}")
    if list(suites) == list(SUITES):
        return "all"
    return "+".join(slug(s) for s in suites)


def result_filename(gpu_name: str, date: str, commit: Optional[str], tag: str = "") -> str:
    """<gpu-slug>_<YYYY-MM-DD>_<commit>[-tag].json"""
    name = f"{slug(gpu_name)}_{date}_{slug(commit) if commit else 'nogit'}"
    return name + (f"-{tag}" if tag else "") + ".json"


def _jsonable(v: Any) -> Any:
    """NaN and infinities become null (JSON has no such numbers); tuples become lists."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def free_path(path: Path) -> Path:
    """`path`, or `stem-2.ext`, `stem-3.ext`, ... if it exists: a re-run never overwrites."""
    if not path.exists():
        return path
    i = 2
    while True:
        cand = path.with_name(f"{path.stem}-{i}{path.suffix}")
        if not cand.exists():
            return cand
        i += 1


def write_json(result: dict[str, Any], out_dir: Path | str, filename: str) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = free_path(out / filename)
    text = json.dumps(_jsonable(result), indent=1, sort_keys=False, allow_nan=False)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)
    return path


def git_info(root: Path | None = None, override: Optional[str] = None) -> dict[str, Any]:
    """{"commit": short hash or None, "dirty": bool or None}; `override` (--commit, or
    CONVGEN_BENCH_COMMIT) names the commit where the tree is not a git checkout."""
    root = root or _repo_root()
    commit = dirty = None
    try:
        r = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=10", "HEAD"],
                           capture_output=True, text=True, timeout=10)
        if r.returncode == 0 and r.stdout.strip():
            commit = r.stdout.strip()
            s = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
            if s.returncode == 0:
                dirty = bool(s.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    if override:
        if commit is None or not (override.startswith(commit) or commit.startswith(override)):
            dirty = None  # the tree here is not (known to be) that commit
        commit = override
    return {"commit": commit, "dirty": dirty}


# --------------------------------------------------------------------------- plot


def plot(result: dict[str, Any], path: Path | str) -> Path:
    """Grouped bars per layer and pass, one panel per suite, log-scale y, a line at 1.0:
    the speedup over cuDNN, or (a convgen-only run) floor/convgen, the fraction of the roofline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    suites = [s for s in result["suites"] if s["rows"]]
    have_speedup = any(r.get("speedup") is not None for s in suites for r in s["rows"])

    def value(r: dict[str, Any]) -> Optional[float]:
        if have_speedup:
            return r.get("speedup")
        of = r.get("over_floor")
        return None if not of else 1.0 / of

    ylabel = "speedup vs cuDNN (cuDNN time / convgen time)" if have_speedup else "floor / convgen time"
    nl = max([len({r["layer"] for r in s["rows"]}) for s in suites] + [1])
    fig, axes = plt.subplots(max(len(suites), 1), 1, figsize=(max(7.0, 1.0 * nl + 2.5), 3.6 * max(len(suites), 1)),
                             squeeze=False)
    colors = {"fprop": "#4c72b0", "dgrad": "#dd8452", "wgrad": "#55a868"}
    for ax, s in zip(axes[:, 0], suites):
        layers: list[str] = []
        for r in s["rows"]:
            if r["layer"] not in layers:
                layers.append(r["layer"])
        passes = [p.value for p in Pass if any(r["pass"] == p.value for r in s["rows"])]
        width = 0.8 / max(len(passes), 1)
        allv: list[float] = []
        for j, p in enumerate(passes):
            xs, ys, bad = [], [], []
            for r in s["rows"]:
                v = value(r)
                if r["pass"] == p and v is not None:
                    xs.append(layers.index(r["layer"]) + (j - (len(passes) - 1) / 2) * width)
                    ys.append(v)
                    bad.append(mismatch(r))
            # bars grow from 1.0: up where convgen is faster (or nearer the floor), down where not
            bars = ax.bar(xs, [y - 1.0 for y in ys], width, bottom=1.0, label=p, color=colors.get(p))
            for b, y, m in zip(bars, ys, bad):
                ax.annotate(f"{y:.2f}" + ("!" if m else ""), (b.get_x() + b.get_width() / 2, y),
                            ha="center", va="bottom" if y >= 1 else "top", fontsize=6,
                            color="red" if m else "black")
            allv.extend(ys)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_yscale("log")
        lo, hi = min(allv + [1.0]), max(allv + [1.0])
        ax.set_ylim(lo / 1.4, hi * 1.4)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if hi / lo < 20 else ""))
        ax.tick_params(axis="y", which="both", labelsize=7)
        ax.set_xticks(range(len(layers)))
        ax.set_xticklabels(layers, rotation=30, ha="right", fontsize=8)
        g = s["summary"]["speedup" if have_speedup else "over_floor"].get("all")
        if g is not None and not have_speedup:
            g = 1.0 / g
        ax.set_title(f"{s['name']}" + (f"  (geomean {g:.2f})" if g is not None else ""), fontsize=10)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.legend(fontsize=8)
    gpu = (result.get("gpu") or {}).get("name") or ""
    commit = (result.get("git") or {}).get("commit") or ""
    fig.suptitle(f"convgen vs cuDNN  {gpu}  {result.get('date', '')}  {commit}".strip(), fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- progress


class Progress:
    """tqdm on stderr when it is importable, else a plain counter (at most ~10 lines
    when stderr is not a terminal)."""

    def __init__(self, total: int, enabled: bool = True, desc: str = "bench") -> None:
        self.total, self.done, self.enabled = total, 0, enabled
        self._bar = None
        self._tty = sys.stderr.isatty()
        if enabled:
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, desc=desc, unit="row", file=sys.stderr, dynamic_ncols=True,
                                 mininterval=0.5 if self._tty else 10.0)
            except ImportError:
                self._bar = None

    def step(self, label: str) -> None:
        """Say that `label` is starting."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(label, refresh=False)
        elif self._tty:
            print(f"\r[{self.done + 1}/{self.total}] {label:<50}", end="", file=sys.stderr, flush=True)
        else:
            every = max(1, self.total // 10)
            if self.done % every == 0:
                print(f"[{self.done + 1}/{self.total}] {label}", file=sys.stderr, flush=True)

    def update(self) -> None:
        self.done += 1
        if self.enabled and self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.enabled and self._tty:
            print(file=sys.stderr)


# --------------------------------------------------------------------------- timing core


def time_interleaved(dev: Any, ops: Sequence[tuple[str, Callable[[], Any]]], reps: int, *,
                     flush: bool = True, spin_us: float = MIN_SPIN_US, head_start_us: float = 2000.0) -> dict[str, list[float]]:
    """Per-rep GPU times (us) of each op, reps interleaved: A B A B ...

    Every rep is [spin] [L2 flush] start-event op end-event, all on one stream and
    enqueued without synchronising, so only the op lies between its events; the
    spin keeps the GPU behind the host, so no host launch gap is ever timed.
    `dev` provides sync(), spin(us), flush(), event(), record(ev), elapsed_us(a, b).
    """
    events: dict[str, list[tuple[Any, Any]]] = {name: [] for name, _ in ops}
    for name, _ in ops:
        events[name] = [(dev.event(), dev.event()) for _ in range(reps)]
    dev.sync()
    dev.spin(head_start_us)
    for i in range(reps):
        for name, fn in ops:
            dev.spin(spin_us)
            if flush:
                dev.flush()
            start, end = events[name][i]
            dev.record(start)
            fn()
            dev.record(end)
    dev.sync()
    return {name: [dev.elapsed_us(a, b) for a, b in evs] for name, evs in events.items()}


def host_overhead(dev: Any, fn: Callable[[], Any], calls: int,
                  clock: Callable[[], float] = time.perf_counter) -> tuple[float, bool]:
    """Host-side microseconds per call: wall clock of `calls` back-to-back calls while a
    spin kernel holds the GPU, divided by `calls` (no GPU work and no waiting on it is in
    the number).  Also says whether the spin outlasted the calls (True: a clean number)."""
    dev.sync()
    t0 = clock()
    for _ in range(3):
        fn()
    est = (clock() - t0) / 3
    dev.sync()
    dev.spin(max(1000.0, 3.0 * calls * est * 1e6))
    marker = dev.event()
    dev.record(marker)
    t0 = clock()
    for _ in range(calls):
        fn()
    t1 = clock()
    covered = not dev.done(marker)
    dev.sync()
    return (t1 - t0) / calls * 1e6, covered


# --------------------------------------------------------------------------- CLI


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench", conflict_handler="resolve",
        help="time convgen against cuDNN per layer and pass (needs a CUDA GPU)",
        description="Time convgen's kernels against cuDNN (PyTorch) for a built-in suite or one shape: "
                    "GPU medians with L2 flushed, host cost per call, cold compile time, roofline floor. "
                    "Writes JSON to --out. See benchmarks/README.md.",
    )
    _add_shape_args(p)
    p.add_argument("--suite", action="append", metavar="NAME",
                   help=f"a built-in suite ({', '.join(SUITES)}) or 'all'; repeatable")
    p.add_argument("--layers", help="only these layer names (comma-separated)")
    p.add_argument("--pass", dest="pass_", default="all", choices=("fprop", "dgrad", "wgrad", "all"))
    p.add_argument("--reps", type=int, default=DEFAULT_REPS, help=f"timed reps per side (default {DEFAULT_REPS})")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP,
                   help=f"untimed calls per side first; the first runs cuDNN's autotuning (default {DEFAULT_WARMUP})")
    p.add_argument("--host-calls", type=int, default=DEFAULT_HOST_CALLS,
                   help=f"calls timed for the host-side cost (default {DEFAULT_HOST_CALLS}; 0 skips it)")
    p.add_argument("--out", default=None, help="folder for the JSON (default benchmarks/results)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw speedup per layer and pass; 'auto' puts it beside the JSON")
    p.add_argument("--no-torch", action="store_true", help="convgen alone, even if torch is installed")
    p.add_argument("--no-bias", action="store_true", help="fprop without bias and wgrad without db, on both sides")
    p.add_argument("--no-compile-time", action="store_true",
                   help="skip the cold/warm compile timing (uses the normal kernel cache; faster)")
    p.add_argument("--json-only", action="store_true", help="print only the JSON path, no table")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--commit", default=os.environ.get("CONVGEN_BENCH_COMMIT"),
                   help="the commit to name the results by where this is not a git checkout "
                        "(default: $CONVGEN_BENCH_COMMIT, else git)")
    p.add_argument("--dry-run", action="store_true",
                   help="list the rows, FLOPs, bytes and plans (for sm_90, 132 SMs) without a GPU")
    p.set_defaults(func=cmd_bench)


def resolve_items(args: argparse.Namespace) -> tuple[list[str], list[Item]]:
    """(suite names, rows of work) from the arguments; UsageError for a bad combination."""
    shape = [getattr(args, n, None) for n in "nhwckrs"]
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
        groups = [("shape", _layers(ns))]
    if args.layers:
        wanted = [n.strip() for n in args.layers.split(",") if n.strip()]
        known = {l.name for _, ls in groups for l in ls}
        unknown = [n for n in wanted if n not in known]
        if unknown:
            raise UsageError(f"--layers: no layer named {', '.join(unknown)}; these are: {', '.join(sorted(known))}")
        groups = [(s, [l for l in ls if l.name in wanted]) for s, ls in groups]
    passes = list(Pass) if args.pass_ == "all" else [Pass.parse(args.pass_)]
    items = [Item(s, l, p) for s, ls in groups for l in ls for p in passes]
    if not items:
        raise UsageError("nothing to run")
    for name, v, low in (("--reps", args.reps, 1), ("--warmup", args.warmup, 0), ("--host-calls", args.host_calls, 0)):
        if v < low:
            raise UsageError(f"{name} must be >= {low}, got {v}")
    return suites, items


def epilogue_for(pass_: Pass, bias: bool) -> Epilogue:
    """What convgen's call computes in the bench: fprop with bias, wgrad with db, fp16 out."""
    return Epilogue(bias=bias and pass_ is not Pass.DGRAD, relu=False, out_dtype="float16")


def computes(pass_: Pass, bias: bool) -> dict[str, str]:
    """What each side computes in a row, for the JSON."""
    if pass_ is Pass.FPROP:
        return {
            "convgen": "convgen.conv2d(x, w" + (", bias" if bias else "")
                       + "): x NHWC, w KRSC fp16" + (", bias fp32 (fused)" if bias else "") + ", y fp16",
            "cudnn": "torch.nn.functional.conv2d(x, w" + (", bias" if bias else "")
                     + "): fp16 channels_last" + (", bias fp16" if bias else "") + ", y fp16",
        }
    if pass_ is Pass.DGRAD:
        return {
            "convgen": "convgen.conv2d_dgrad(dy, w, x.shape): fp16 in, dx fp16",
            "cudnn": "torch.ops.aten.convolution_backward(dy, x, w, output_mask=[True, False, False]): dx fp16, channels_last",
        }
    return {
        "convgen": f"convgen.conv2d_wgrad(x, dy, w.shape, bias={bias}): dw" + (" and db" if bias else "") + " fp16",
        "cudnn": "torch.ops.aten.convolution_backward(dy, x, w, output_mask=[False, True, "
                 + ("True]): dw and db" if bias else "False]): dw") + " fp16, channels_last",
    }


def new_row(item: Item, *, bias: bool, target: Optional[Target], with_cudnn: bool,
            gpu_name: Optional[str] = None) -> dict[str, Any]:
    """A row with the static facts filled in and every measurement null."""
    prob = item.layer.problem
    g = prob.gemm(item.pass_)
    what = computes(item.pass_, bias)
    row: dict[str, Any] = {
        "suite": item.suite, "layer": item.layer.name, "pass": item.pass_.value,
        "problem": prob.as_dict(), "describe": prob.describe(),
        "gemm": {"m": g.m, "n": g.n, "k": g.k},
        "flops": useful_flops(prob),
        "gemm_flops": g.flops,
        "traffic": traffic(prob, item.pass_, bias=bias and item.pass_ is not Pass.DGRAD),
        "convgen": {"computes": what["convgen"], "key": None, "plan": None, "time_us": None, "tflops": None,
                    "host_us": None, "host_clean": None, "compile_cold_ms": None, "compile_warm_ms": None,
                    "error": None},
        "cudnn": ({"computes": what["cudnn"], "time_us": None, "tflops": None, "host_us": None,
                   "host_clean": None, "first_call_ms": None, "error": None} if with_cudnn else None),
        "check": None, "floor_us": None, "floor_bound": None, "speedup": None, "over_floor": None,
    }
    row["bytes"] = sum(row["traffic"].values())
    if target is not None:
        try:
            from .planner import make_spec
            from .tune import tuned_plan

            # The plan convgen.conv2d will run: the tuned one for this GPU when there is one.
            tuned = tuned_plan(gpu_name, prob.geometry, item.pass_, "float16", target.arch) if gpu_name else None
            spec = make_spec(prob, item.pass_, target=target, epilogue=epilogue_for(item.pass_, bias),
                             in_dtype="float16", plan_=tuned)
            row["convgen"]["key"] = spec.key
            row["convgen"]["plan"] = spec.plan.as_dict()
        except Exception as exc:  # a shape the planner refuses: the run says so in the row
            row["convgen"]["error"] = _err(exc)
    return row


def _err(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 600 else text[:600] + "..."


def build_result(rows_by_suite: Sequence[tuple[str, list[dict[str, Any]]]], **meta: Any) -> dict[str, Any]:
    all_rows = [r for _, rows in rows_by_suite for r in rows]
    result = {"format": RESULT_FORMAT, "tool": "convgen bench", **meta}
    result["suites"] = [{"name": name, "rows": rows, "summary": summarize(rows)} for name, rows in rows_by_suite]
    result["summary"] = summarize(all_rows)
    return result


def _group(items: Sequence[Item], rows: Sequence[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for it, r in zip(items, rows):
        groups.setdefault(it.suite, []).append(r)
    return list(groups.items())


def dry_run(items: Sequence[Item], bias: bool) -> int:
    target = Target("sm_90", 132)
    rows = [new_row(it, bias=bias, target=target, with_cudnn=True) for it in items]
    print(f"convgen bench --dry-run: {len(rows)} rows (plans for {target.arch}, {target.sm_count} SMs); nothing is timed")
    for name, group in _group(items, rows):
        print(f"\n== {name} ==")
        hdr = ("layer", "pass", "GFLOP", "MB", "GEMM m x n x k", "plan", "key")
        body = []
        for r in group:
            pl = r["convgen"]["plan"]
            plan_s = Plan.from_dict(pl).brief() if pl else (r["convgen"]["error"] or "-")
            g = r["gemm"]
            body.append((r["layer"], r["pass"], f"{r['flops'] / 1e9:.2f}", f"{r['bytes'] / 1e6:.1f}",
                         f"{g['m']} x {g['n']} x {g['k']}", plan_s, r["convgen"]["key"] or "-"))
        widths = [max([len(h)] + [len(b[i]) for b in body]) for i, h in enumerate(hdr)]
        for cells in [hdr] + body:
            print("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    suites, items = resolve_items(args)
    bias = not args.no_bias
    if args.dry_run:
        return dry_run(items, bias)
    reason = gpu_unavailable_reason()
    if reason is not None:
        print(f"convgen bench: no CUDA GPU ({reason})", file=sys.stderr)
        return 1
    from .compile import DeviceError

    try:
        result = run_bench(args, suites, items, bias)
    except DeviceError as exc:  # a GPU convgen does not support, or none usable after all
        print(f"convgen bench: no CUDA GPU ({exc})", file=sys.stderr)
        return 1
    tag = run_tag(suites, [it.layer for it in items])
    out_dir = Path(args.out) if args.out else default_out_dir()
    name = result_filename(result["gpu"]["name"] or "gpu", result["date"], result["git"]["commit"], tag)
    path = write_json(result, out_dir, name)
    report = format_report(result)
    path.with_suffix(".txt").write_text(report)
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


# =========================================================================== GPU parts


_SPIN_SRC = r"""
extern "C" __global__ void convgen_bench_spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


class CudaDevice:
    """The stream everything runs on, CUDA events, the L2 flush and a spin kernel."""

    def __init__(self, cupy: Any, stream: Any, flush_bytes: int = L2_FLUSH_BYTES) -> None:
        import numpy as np

        self.cp, self.np, self.stream = cupy, np, stream
        self._l2 = cupy.empty(flush_bytes, dtype=cupy.uint8)
        self._spin = cupy.RawKernel(_SPIN_SRC, "convgen_bench_spin")
        self.cycles_per_us = self._calibrate()

    def sync(self) -> None:
        self.cp.cuda.Device().synchronize()

    def flush(self) -> None:
        self._l2.fill(0)

    def spin(self, us: float) -> None:
        if us > 0:
            self._spin((1,), (1,), (self.np.int64(us * self.cycles_per_us),))

    def event(self) -> Any:
        return self.cp.cuda.Event()

    def record(self, ev: Any) -> None:
        ev.record(self.stream)

    def done(self, ev: Any) -> bool:
        return bool(ev.done)

    def elapsed_us(self, a: Any, b: Any) -> float:
        return float(self.cp.cuda.get_elapsed_time(a, b)) * 1000.0

    def _calibrate(self, tries: int = 3) -> float:
        """SM clock cycles per microsecond, for spin(us).  The highest of a few readings:
        over-estimating the clock only makes a spin longer, which is the safe side."""
        self._spin((1,), (1,), (self.np.int64(1000),))
        for _ in range(8):  # some load first, so the clocks are up
            self.flush()
        cycles = 2_000_000
        best = 0.0
        for _ in range(tries):
            a, b = self.event(), self.event()
            self.sync()
            self.record(a)
            self._spin((1,), (1,), (self.np.int64(cycles),))
            self.record(b)
            self.sync()
            us = self.elapsed_us(a, b)
            if us > 0:
                best = max(best, cycles / us)
        return best or 2000.0

    def recalibrate(self) -> None:
        self.cycles_per_us = max(self.cycles_per_us, self._calibrate())


def _import_torch() -> tuple[Any, Optional[str]]:
    try:
        import torch
    except Exception as exc:
        return None, f"torch is not importable ({type(exc).__name__}: {exc})"
    try:
        if not torch.cuda.is_available():
            return None, "torch has no CUDA device (torch.cuda.is_available() is False)"
    except Exception as exc:
        return None, f"torch CUDA is not usable ({type(exc).__name__}: {exc})"
    return torch, None


def _environment(cupy: Any, torch: Any, target: Target) -> dict[str, Any]:
    import convgen
    from . import compile as cc

    rt = cupy.cuda.runtime
    dev_id = cupy.cuda.Device().id
    props = rt.getDeviceProperties(dev_id)
    name = props.get("name", b"")
    name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)

    def ver(v: int) -> str:
        return f"{v // 1000}.{(v % 1000) // 10}"

    versions: dict[str, Any] = {"convgen": convgen.__version__, "cupy": cupy.__version__,
                                "python": platform.python_version(), "torch": None, "torch_cuda": None,
                                "cudnn": None, "driver": None, "cuda_runtime": None, "nvrtc": None}
    for key, fn in (("driver", lambda: ver(rt.driverGetVersion())),
                    ("cuda_runtime", lambda: ver(rt.runtimeGetVersion())),
                    ("nvrtc", lambda: "%d.%d" % cc.nvrtc_version())):
        try:
            versions[key] = fn()
        except Exception:
            pass
    if torch is not None:
        versions["torch"] = torch.__version__
        versions["torch_cuda"] = torch.version.cuda
        try:
            v = torch.backends.cudnn.version()
            versions["cudnn"] = None if v is None else f"{v // 10000}.{(v % 10000) // 100}.{v % 100}"
        except Exception:
            pass
    gpu = {"name": name, "device": dev_id, "arch": target.arch, "sm_count": target.sm_count,
           "memory_bytes": props.get("totalGlobalMem"), "l2_bytes": props.get("l2CacheSize")}
    return {"gpu": gpu, "versions": versions}


class Session:
    """Everything one run needs on the GPU: CuPy, torch (or None), the device, the stream."""

    def __init__(self, cupy: Any, torch: Any, dev: CudaDevice, target: Target, args: argparse.Namespace) -> None:
        self.cp, self.torch, self.dev, self.target, self.args = cupy, torch, dev, target, args

    # ----------------------------------------------------------------- ceilings
    def ceilings(self) -> dict[str, Any]:
        """The fp16 GEMM rate (TFLOP/s) and the device-to-device copy bandwidth (GB/s, bytes
        read + written), medians of 10 after 3 warm-up runs, measured here and now."""
        cp, torch = self.cp, self.torch
        n = GEMM_SIZE
        out: dict[str, Any] = {"gemm_tflops": None, "gemm_size": n, "gemm_us": None,
                               "gemm_source": "torch.matmul fp16" if torch is not None else "cupy.matmul fp16 (cuBLAS)",
                               "copy_gbps": None, "copy_bytes": COPY_BYTES, "copy_us": None,
                               "copy_source": "cudaMemcpyAsync device to device", "errors": []}
        try:
            t = self._median_run(self._gemm_op)
            out["gemm_us"] = time_stats(t)
            out["gemm_tflops"] = 2.0 * n ** 3 / (statistics.median(t) * 1e6)
        except Exception as exc:
            out["errors"].append("gemm: " + _err(exc))
        try:
            t = self._median_run(self._copy_op)
            out["copy_us"] = time_stats(t)
            out["copy_gbps"] = 2.0 * COPY_BYTES / (statistics.median(t) * 1e3)  # read + write
        except Exception as exc:
            out["errors"].append("copy: " + _err(exc))
        self.dev.sync()
        cp.get_default_memory_pool().free_all_blocks()
        if torch is not None:
            torch.cuda.empty_cache()
        return out

    def _median_run(self, make: Callable[[], Callable[[], Any]], reps: int = 10) -> list[float]:
        fn = make()  # holds its buffers; they are released when this returns
        for _ in range(3):
            fn()
        return time_interleaved(self.dev, [("op", fn)], reps, flush=False, spin_us=0.0)["op"]

    def _gemm_op(self) -> Callable[[], Any]:
        cp, torch, n = self.cp, self.torch, GEMM_SIZE
        if torch is not None:
            a = torch.randn(n, n, device="cuda", dtype=torch.float16)
            b = torch.randn(n, n, device="cuda", dtype=torch.float16)
            return lambda: torch.matmul(a, b)
        import numpy as np

        rng = np.random.default_rng(0)
        ca = cp.asarray(rng.standard_normal((n, n), dtype=np.float32).astype(np.float16))
        cb = cp.asarray(rng.standard_normal((n, n), dtype=np.float32).astype(np.float16))
        return lambda: cp.matmul(ca, cb)

    def _copy_op(self) -> Callable[[], Any]:
        cp = self.cp
        src = cp.empty(COPY_BYTES, dtype=cp.uint8)
        dst = cp.empty(COPY_BYTES, dtype=cp.uint8)
        src.fill(1)
        return lambda: dst.data.copy_from_device_async(src.data, COPY_BYTES)

    # ----------------------------------------------------------------- data
    def make_data(self, problem: ConvProblem, seed: int) -> dict[str, Any]:
        """fp16 data made once; convgen (CuPy, NHWC/KRSC) and cuDNN (torch NCHW views in
        channels_last memory) read the very same bytes."""
        cp, torch = self.cp, self.torch
        fan_in = problem.r * problem.s * problem.c
        d: dict[str, Any] = {}
        if torch is not None:
            g = torch.Generator(device="cuda")
            g.manual_seed(seed)

            def randn(shape: tuple[int, ...], scale: float = 1.0) -> Any:
                t = torch.randn(shape, generator=g, device="cuda", dtype=torch.float32)
                return (t * scale).to(torch.float16) if scale != 1.0 else t.to(torch.float16)

            x = randn(problem.x_shape)  # NHWC
            w = randn(problem.w_shape, 1.0 / math.sqrt(fan_in))  # KRSC
            dy = randn(problem.y_shape)  # NPQK
            b = randn((problem.k,))
            # NCHW / KCRS logical views of the NHWC / KRSC memory: channels_last tensors
            d["x_t"], d["w_t"], d["dy_t"] = (t.permute(0, 3, 1, 2) for t in (x, w, dy))
            d["b_t"] = b
            for name in ("x_t", "w_t", "dy_t"):
                if not d[name].is_contiguous(memory_format=torch.channels_last):
                    raise RuntimeError(f"{name} is not channels_last")  # pragma: no cover
            d["x"], d["w"], d["dy"] = (cp.from_dlpack(t) for t in (x, w, dy))
            d["b32"] = cp.from_dlpack(b).astype(cp.float32)  # convgen reads the bias as fp32: same values
            if d["x"].data.ptr != x.data_ptr() or d["dy"].data.ptr != dy.data_ptr():
                raise RuntimeError("DLPack made a copy")  # pragma: no cover
        else:  # drawn on the host (numpy) and copied up: no cuRAND needed
            import numpy as np

            rng = np.random.default_rng(seed)

            def up(shape: tuple[int, ...], scale: float = 1.0, dtype: str = "float16") -> Any:
                a = rng.standard_normal(shape, dtype=np.float32)
                if scale != 1.0:
                    a *= scale
                return cp.asarray(a.astype(np.float16).astype(dtype))

            d["x"] = up(problem.x_shape)
            d["w"] = up(problem.w_shape, 1.0 / math.sqrt(fan_in))
            d["dy"] = up(problem.y_shape)
            d["b32"] = up((problem.k,), dtype="float32")  # fp16 values, as the torch path has
        for name in ("x", "w", "dy"):
            if not d[name].flags.c_contiguous:
                raise RuntimeError(f"{name} is not contiguous: convgen would copy it on every call")  # pragma: no cover
        return d

    # ----------------------------------------------------------------- ops
    def ops(self, problem: ConvProblem, pass_: Pass, d: dict[str, Any], bias: bool
            ) -> tuple[Callable[[], Any], Optional[Callable[[], Any]]]:
        import convgen

        st, pad, dil = problem.stride, problem.padding, problem.dilation
        torch = self.torch
        if pass_ is Pass.FPROP:
            b32 = d["b32"] if bias else None

            def cg() -> Any:
                return convgen.conv2d(d["x"], d["w"], b32, stride=st, padding=pad, dilation=dil)
        elif pass_ is Pass.DGRAD:
            xs = problem.x_shape

            def cg() -> Any:
                return convgen.conv2d_dgrad(d["dy"], d["w"], xs, stride=st, padding=pad, dilation=dil)
        else:
            ws = problem.w_shape

            def cg() -> Any:
                return convgen.conv2d_wgrad(d["x"], d["dy"], ws, stride=st, padding=pad, dilation=dil, bias=bias)
        if torch is None:
            return cg, None
        F = torch.nn.functional
        aten = torch.ops.aten
        sl, pl, dl = list(st), list(pad), list(dil)
        if pass_ is Pass.FPROP:
            bt = d["b_t"] if bias else None

            def cd() -> Any:
                return F.conv2d(d["x_t"], d["w_t"], bt, sl, pl, dl)
        elif pass_ is Pass.DGRAD:
            def cd() -> Any:
                return aten.convolution_backward(d["dy_t"], d["x_t"], d["w_t"], None, sl, pl, dl, False, [0, 0], 1,
                                                 [True, False, False])[0]
        else:
            bsz = [problem.k] if bias else None

            def cd() -> Any:
                _, dw, db = aten.convolution_backward(d["dy_t"], d["x_t"], d["w_t"], bsz, sl, pl, dl, False,
                                                      [0, 0], 1, [False, True, bias])
                return (dw, db) if bias else (dw,)
        return cg, cd

    def compare(self, pass_: Pass, cg_out: Any, cd_out: Any) -> dict[str, Any]:
        """Norm-relative difference of convgen's output(s) from cuDNN's, in fp32 on the GPU."""
        cp = self.cp

        def as_cupy_nhwc(t: Any) -> Any:
            return cp.from_dlpack(t.permute(0, 2, 3, 1) if t.dim() == 4 else t)

        def rel(a: Any, b: Any) -> float:  # reductions only (no cuBLAS), fp64 sums
            a = a.astype(cp.float32).ravel()
            b = b.astype(cp.float32).ravel()
            diff = a - b
            den = math.sqrt(float(cp.sum(b * b, dtype=cp.float64)))
            num = math.sqrt(float(cp.sum(diff * diff, dtype=cp.float64)))
            if not math.isfinite(num):
                return float("inf")
            return num / max(den, 1e-30)

        if pass_ is Pass.WGRAD:
            mine = [o for o in cg_out if o is not None]
            names = ["dw", "db"][: len(mine)]
            theirs = list(cd_out)
        else:
            mine, theirs, names = [cg_out], [cd_out], (["y"] if pass_ is Pass.FPROP else ["dx"])
        parts = {}
        for name, a, b in zip(names, mine, theirs):
            b = as_cupy_nhwc(b)
            if a.shape != b.shape:
                raise RuntimeError(f"{name}: convgen shape {a.shape} vs cuDNN {b.shape}")
            parts[name] = rel(a, b)
        err = max(parts.values())
        return {"rel_err": err, "parts": parts, "tol": TOLERANCE, "ok": err < TOLERANCE}

    # ----------------------------------------------------------------- compile time
    def compile_times(self, cg: Callable[[], Any], tmp_root: Path, index: int) -> tuple[float, float]:
        """(cold ms, warm-disk ms) of convgen's first call: a fresh CONVGEN_CACHE_DIR and empty
        memory caches (plan, emit, NVRTC, load, one launch), then memory caches emptied again
        with the disk entry kept (read, load, one launch)."""
        import convgen
        from . import compile as cc

        old = os.environ.get("CONVGEN_CACHE_DIR")
        os.environ["CONVGEN_CACHE_DIR"] = str(tmp_root / f"row{index}")
        try:
            times = []
            for _ in range(2):
                convgen.clear_cache()
                cc.clear_memory_cache()
                self.dev.sync()
                t0 = time.perf_counter()
                cg()
                self.dev.sync()
                times.append((time.perf_counter() - t0) * 1e3)
        finally:
            if old is None:
                os.environ.pop("CONVGEN_CACHE_DIR", None)
            else:
                os.environ["CONVGEN_CACHE_DIR"] = old
        return times[0], times[1]

    # ----------------------------------------------------------------- one row
    def run_row(self, item: Item, row: dict[str, Any], d: dict[str, Any], index: int,
                tmp_root: Optional[Path]) -> None:
        args, dev = self.args, self.dev
        prob, pass_, bias = item.layer.problem, item.pass_, not args.no_bias
        cgr, cdr = row["convgen"], row["cudnn"]
        cg, cd = self.ops(prob, pass_, d, bias)
        ops: list[tuple[str, Callable[[], Any]]] = []
        cg_out = cd_out = None
        # convgen: compile (timed cold and warm), then warm up
        try:
            if tmp_root is not None:
                cgr["compile_cold_ms"], cgr["compile_warm_ms"] = self.compile_times(cg, tmp_root, index)
            for _ in range(max(args.warmup, 1)):
                cg_out = cg()
            dev.sync()
            ops.append(("convgen", cg))
        except Exception as exc:
            cgr["error"] = _err(exc)
            cg_out = None
            _recover(dev)
        if cd is not None:
            try:
                dev.sync()
                t0 = time.perf_counter()
                cd_out = cd()
                dev.sync()
                cdr["first_call_ms"] = (time.perf_counter() - t0) * 1e3
                for _ in range(max(args.warmup - 1, 0)):
                    cd_out = cd()
                dev.sync()
                ops.append(("cudnn", cd))
            except Exception as exc:
                cdr["error"] = _err(exc)
                cd_out = None
                _recover(dev)
        if cg_out is not None and cd_out is not None:
            try:
                row["check"] = self.compare(pass_, cg_out, cd_out)
            except Exception as exc:
                row["check"] = {"rel_err": None, "parts": {}, "tol": TOLERANCE, "ok": None, "error": _err(exc)}
        cg_out = cd_out = None
        if not ops:
            return
        # host-side cost per call, GPU held busy
        host = {}
        if args.host_calls > 0:
            for name, fn in ops:
                side = cgr if name == "convgen" else cdr
                try:
                    side["host_us"], side["host_clean"] = host_overhead(dev, fn, args.host_calls)
                    host[name] = side["host_us"]
                except Exception as exc:
                    side["error"] = side["error"] or _err(exc)
                    _recover(dev)
        # GPU time: interleaved reps, L2 flushed, spin long enough that the host stays ahead
        # unmeasured host cost: a generous 100 us
        spin = max([MIN_SPIN_US if host else 100.0] + [1.5 * v for v in host.values()])
        row["spin_us"] = spin
        try:
            times = time_interleaved(dev, ops, args.reps, spin_us=spin)
            for name, samples in times.items():
                (cgr if name == "convgen" else cdr)["time_us"] = time_stats(samples)
        except Exception as exc:
            cgr["error"] = cgr["error"] or ("timing: " + _err(exc))
            _recover(dev)


def _recover(dev: Any) -> None:
    try:
        dev.sync()
    except Exception:
        pass


def run_bench(args: argparse.Namespace, suites: Sequence[str], items: Sequence[Item], bias: bool) -> dict[str, Any]:
    import cupy

    from .compile import detect_target

    notes: list[str] = []
    torch = None
    if args.no_torch:
        notes.append("--no-torch: convgen alone; cuDNN fields are null")
    else:
        torch, why = _import_torch()
        if torch is None:
            notes.append(f"{why}: convgen alone; cuDNN fields are null")
            print(f"convgen bench: {why}; timing convgen alone", file=sys.stderr)
    if torch is not None:
        torch.backends.cudnn.benchmark = True
        if not torch.backends.cudnn.is_available():
            notes.append("torch reports cuDNN unavailable: the 'cudnn' side is PyTorch's non-cuDNN convolution")

    target = detect_target()
    if torch is not None:
        ptr = torch.cuda.current_stream().cuda_stream
        stream = cupy.cuda.ExternalStream(ptr) if ptr else cupy.cuda.Stream.null
    else:
        stream = cupy.cuda.Stream.null
    now = _dt.datetime.now(_dt.timezone.utc)
    git = git_info(override=args.commit)
    tmp_root = None if args.no_compile_time else Path(tempfile.mkdtemp(prefix="convgen-bench-cache-"))
    grad = torch.no_grad() if torch is not None else contextlib.nullcontext()
    from .runtime import _gpu_name

    gpu_name = _gpu_name(cupy.cuda.Device().id)
    rows = [new_row(it, bias=bias, target=target, with_cudnn=torch is not None, gpu_name=gpu_name) for it in items]
    try:
        with stream, grad:
            dev = CudaDevice(cupy, stream)
            env = _environment(cupy, torch, target)
            session = Session(cupy, torch, dev, target, args)
            progress = Progress(len(items) + 1, enabled=not args.no_progress)
            progress.step("ceilings")
            ceilings = session.ceilings()
            dev.recalibrate()  # the GEMM has brought the clocks up
            ceilings["spin_clock_mhz"] = dev.cycles_per_us
            progress.update()
            data_key = None
            data: dict[str, Any] = {}
            for i, (it, row) in enumerate(zip(items, rows)):
                progress.step(it.label)
                key = (it.suite, it.layer.name)
                if key != data_key:  # one data set per layer, shared by its passes
                    data = {}
                    session.dev.sync()
                    try:
                        data = session.make_data(it.layer.problem, seed=1000 + i)
                    except Exception as exc:
                        row["convgen"]["error"] = "data: " + _err(exc)
                    data_key = key
                if data:
                    session.run_row(it, row, data, i, tmp_root)
                finish_row(row, ceilings)
                progress.update()
            data = {}
            progress.close()
    finally:
        if tmp_root is not None:
            shutil.rmtree(tmp_root, ignore_errors=True)
    host = {}
    for side in ("convgen", "cudnn"):
        vals = [r[side]["host_us"] for r in rows if r.get(side) and r[side].get("host_us") is not None]
        host[side] = ({"median": statistics.median(vals), "min": min(vals), "max": max(vals), "rows": len(vals)}
                      if vals else None)
    settings = {
        "reps": args.reps, "warmup": args.warmup, "host_calls": args.host_calls, "bias": bias,
        "passes": sorted({it.pass_.value for it in items}, key=[p.value for p in Pass].index),
        "suites": list(suites), "layers_filter": args.layers, "torch": torch is not None,
        "cudnn_benchmark": True if torch is not None else None, "tolerance": TOLERANCE,
        "l2_flush_bytes": L2_FLUSH_BYTES, "min_spin_us": MIN_SPIN_US,
        "compile_time": not args.no_compile_time,
        "timing": "CUDA events around the op only, one pair per rep; spin kernel + L2 flush before every rep; "
                  "convgen/cuDNN reps interleaved; median reported",
        "host_cost": "perf_counter over host_calls back-to-back calls while a spin kernel holds the GPU, per call",
        "data": "fp16 N(0,1) x and dy, w scaled by 1/sqrt(R*S*C), bias N(0,1) (fp16 values; convgen reads them as fp32)",
    }
    return build_result(
        _group(items, rows),
        date=now.strftime("%Y-%m-%d"), timestamp=now.isoformat(timespec="seconds"), git=git,
        gpu=env["gpu"], versions=env["versions"], settings=settings, ceilings=ceilings,
        host_overhead_us=host, notes=notes,
    )
