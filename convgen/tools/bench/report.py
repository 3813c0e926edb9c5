"""What `convgen bench` writes: summaries, the text report, result file names and the JSON.

Pure functions on the result dict, so the report can be re-made from a JSON file and is
tested on the CPU.  The plot is in :mod:`.plot` (it needs matplotlib).
"""

from __future__ import annotations

import json
import math
import re
import statistics
import subprocess
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ...fsio import atomic_write
from ...ir import Pass
from ...suites import SUITES, Layer
from .rows import Item, mismatch
from .stats import _median_of, geomean

RESULT_FORMAT = 1


def _repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def default_out_dir() -> Path:
    root = _repo_root()
    return root / "benchmarks" / "results" if (root / "benchmarks").is_dir() else Path("benchmarks") / "results"


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
    return atomic_write(path, text + "\n")


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
