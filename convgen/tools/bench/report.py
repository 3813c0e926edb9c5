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
from .rows import FUSED, LABELS, LOW_RATE_TFLOPS, REGIME_COMPUTE, REGIME_LOW, RESIDUAL, SAME, Item, mismatch
from .stats import _median_of, geomean

RESULT_FORMAT = 2  # 2: same-work rows by default, fused rows apart, eager time, cuDNN regime


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[3]


def default_out_dir() -> Path:
    root = _repo_root()
    return root / "benchmarks" / "results" if (root / "benchmarks").is_dir() else Path("benchmarks") / "results"


def _passes(rows: Sequence[dict[str, Any]]) -> list[str]:
    return [p.value for p in Pass if any(r["pass"] == p.value for r in rows)]


def _means(rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> dict[str, Any]:
    """GPU-time and eager-time geomean speedups, and the rows counted, per pass and 'all'."""
    out: dict[str, Any] = {"speedup": {}, "eager_speedup": {}, "count": {}}
    for key in keys:
        sel = [r for r in rows if key == "all" or r["pass"] == key]
        out["speedup"][key] = geomean(r.get("speedup") for r in sel)
        out["eager_speedup"][key] = geomean(r.get("eager_speedup") for r in sel)
        out["count"][key] = sum(1 for r in sel if r.get("speedup") is not None)
    return out


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Geometric means per pass and over all rows: GPU-time and eager-time speedups, time
    over the floor, TFLOP/s; the same speedups over the rows where cuDNN runs below
    LOW_RATE_TFLOPS and over the compute-bound rest, which are also listed with both rates.
    Rows whose output did not match cuDNN's are left out of every mean (their time is not
    of a correct kernel)."""
    good = [r for r in rows if not mismatch(r)]
    keys = _passes(rows) + ["all"]
    out: dict[str, Any] = _means(good, keys)
    out.update({"over_floor": {}, "over_floor_ref": {}, "cudnn_over_floor": {}, "convgen_tflops": {},
                "cudnn_tflops": {}, "excluded_mismatch": sum(1 for r in rows if mismatch(r))})
    for key in keys:
        sel = [r for r in good if key == "all" or r["pass"] == key]
        out["over_floor"][key] = geomean(r.get("over_floor") for r in sel)
        out["cudnn_over_floor"][key] = geomean(r.get("cudnn_over_floor") for r in sel)
        out["over_floor_ref"][key] = geomean(r.get("over_floor_ref") for r in sel)
        out["convgen_tflops"][key] = geomean(r["convgen"].get("tflops") for r in sel)
        out["cudnn_tflops"][key] = geomean((r.get("cudnn") or {}).get("tflops") for r in sel)
    out["by_regime"] = {
        "threshold_tflops": LOW_RATE_TFLOPS,
        REGIME_LOW: _means([r for r in good if r.get("cudnn_regime") == REGIME_LOW], keys),
        REGIME_COMPUTE: _means([r for r in good if r.get("cudnn_regime") == REGIME_COMPUTE], keys),
    }
    out["compute_bound_rows"] = [
        {"layer": r["layer"], "pass": r["pass"], "convgen_tflops": r["convgen"].get("tflops"),
         "cudnn_tflops": r["cudnn"].get("tflops"), "speedup": r.get("speedup")}
        for r in good if r.get("cudnn_regime") == REGIME_COMPUTE
    ]

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


def _x(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}x"


def row_note(row: dict[str, Any]) -> str:
    notes = []
    if mismatch(row):
        notes.append(f"MISMATCH err={row['check']['rel_err']:.1e}")
    if row["convgen"].get("error"):
        notes.append("convgen error")
    if row.get("cudnn") and row["cudnn"].get("error"):
        notes.append("cudnn error")
    return "; ".join(notes)


# Three figures per side (GPU time with the host hidden, eager time per call, host cost per
# call), the two speedups, both rates, cuDNN's regime and the floor.
TABLE_COLUMNS = ("layer", "pass", "GPU cg", "GPU cuDNN", "GPU x", "eager cg", "eager cuDNN", "eager x",
                 "host cg", "host cuDNN", "TF/s cg", "TF/s cuDNN", "cuDNN<300", "floor", "/floor", "note")


def table_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """An aligned plain-text table of rows (ASCII only; times in microseconds)."""
    body = []
    for r in rows:
        cg, cd = r["convgen"], r.get("cudnn") or {}
        reg = r.get("cudnn_regime")
        body.append((
            r["layer"], r["pass"],
            _us(_median_of(cg.get("time_us"))), _us(_median_of(cd.get("time_us"))), _x(r.get("speedup")),
            _us(_median_of(cg.get("eager_us"))), _us(_median_of(cd.get("eager_us"))), _x(r.get("eager_speedup")),
            _us(cg.get("host_us")), _us(cd.get("host_us")),
            _f(cg.get("tflops"), ".1f"), _f(cd.get("tflops"), ".1f"),
            "-" if reg is None else ("yes" if reg == REGIME_LOW else "no"),
            _us(r.get("floor_us")), _f(r.get("over_floor"), ".2f"),
            row_note(r),
        ))
    widths = [max([len(h)] + [len(b[i]) for b in body]) for i, h in enumerate(TABLE_COLUMNS)]
    left = {0, 1, len(TABLE_COLUMNS) - 1}

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(TABLE_COLUMNS), line(["-" * w for w in widths])] + [line(b) for b in body]


def _by_pass(d: dict[str, Any], fmt: str = ".2f", suffix: str = "x") -> str:
    return ", ".join(f"{k} {_f(v, fmt)}{suffix if v is not None else ''}" for k, v in d.items())


def summary_lines(summary: dict[str, Any]) -> list[str]:
    lines = [
        "geomean speedup (cuDNN/convgen), GPU time: " + _by_pass(summary["speedup"]),
        "geomean speedup (cuDNN/convgen), eager time: " + _by_pass(summary["eager_speedup"]),
    ]
    reg = summary.get("by_regime") or {}
    thr = _f(reg.get("threshold_tflops"), ".0f")
    for name, what in ((REGIME_LOW, f"cuDNN below {thr} TFLOP/s (latency/memory-bound)"),
                       (REGIME_COMPUTE, f"cuDNN at {thr} TFLOP/s or more (compute-bound)")):
        m = reg.get(name)
        if m and any(r.get("count", {}).get("all") for r in (reg.get(REGIME_LOW), reg.get(REGIME_COMPUTE)) if r):
            lines.append(f"  {what}, {m['count'].get('all', 0)} rows: GPU {_by_pass(m['speedup'])}; "
                         f"eager {_by_pass(m['eager_speedup'])}")
    for r in summary.get("compute_bound_rows") or []:
        lines.append(f"    compute-bound: {r['layer']} {r['pass']}: convgen {_f(r['convgen_tflops'], '.0f')} TFLOP/s, "
                     f"cuDNN {_f(r['cudnn_tflops'], '.0f')} TFLOP/s, {_x(r['speedup'])}")
    lines.append("geomean convgen/floor, this run's ceilings: " + _by_pass(summary["over_floor"], suffix="")
                 + "; H200 reference: " + _by_pass(summary.get("over_floor_ref") or {}, suffix=""))
    if any(v is not None for v in (summary.get("cudnn_over_floor") or {}).values()):
        lines.append("geomean cuDNN/floor, the most a kernel at this run's floor could gain over cuDNN: "
                     + _by_pass(summary["cudnn_over_floor"]))
    lines.append("geomean TFLOP/s: convgen " + _by_pass(summary["convgen_tflops"], ".1f", "")
                 + "; cuDNN " + _by_pass(summary.get("cudnn_tflops") or {}, ".1f", ""))
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


def _section(out: list[str], suites: Sequence[dict[str, Any]], summary: Optional[dict[str, Any]], tag: str) -> None:
    for suite in suites:
        out.append("")
        out.append(f"== {suite['name']}{tag} ({len(suite['rows'])} rows) ==")
        out.extend(table_lines(suite["rows"]))
        out.extend(summary_lines(suite["summary"]))
    if len(suites) > 1 and summary:
        out.append("")
        out.append(f"== all suites{tag} ==")
        out.extend(summary_lines(summary))


def format_report(result: dict[str, Any]) -> str:
    out: list[str] = []
    ce = result.get("ceilings") or {}
    st = result.get("settings") or {}
    gpu = (result.get("gpu") or {}).get("name") or "?"
    ref = result.get("reference") or {}
    lf = result.get("launch_floor") or {}
    out.append(f"convgen bench on {gpu}: this run's ceilings: GEMM {_f(ce.get('gemm_tflops'), '.1f')} TFLOP/s, "
               f"copy {_f(ce.get('copy_gbps'), '.0f')} GB/s; reference {ref.get('source') or '-'}")
    out.append(f"launch floor: a bare CuPy RawKernel launch of an empty kernel costs {_us(lf.get('host_us'))} us "
               "of host time per call")
    out.append(f"GPU = CUDA events, L2 flushed, host hidden behind a spin kernel, convgen/cuDNN interleaved, median of "
               f"{st.get('reps')} reps; eager = {st.get('eager_calls')} calls back to back, wall clock to a final sync "
               f"/ calls, median of {st.get('eager_trials')} trials; host = host cost per call with the GPU held busy. "
               "Times in us; cg = convgen; x = cuDNN/convgen")
    out.append(f"rows: {LABELS[SAME]}")
    if st.get("plans"):  # runs before the plans' source was recorded say nothing
        out.append(f"convgen's plans: {st['plans']}")
    for note in result.get("notes", []):
        out.append(f"note: {note}")
    _section(out, result["suites"], result.get("summary"), "")
    for key in ("fused", "residual"):
        apart = result.get(key)
        if apart:
            out.append("")
            out.append(f"=== apart from the means above: {apart['label']} ===")
            _section(out, apart["suites"], apart.get("summary"), f" {key}")
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
                f"-s{p.stride[0]}{p.stride[1]}-p{p.padding[0]}{p.padding[1]}-d{p.dilation[0]}{p.dilation[1]}"
                + (f"-g{p.groups}" if p.groups > 1 else ""))
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


def build_result(rows_by_suite: Sequence[tuple[str, list[dict[str, Any]]]],
                 fused_by_suite: Sequence[tuple[str, list[dict[str, Any]]]] = (),
                 residual_by_suite: Sequence[tuple[str, list[dict[str, Any]]]] = (), **meta: Any) -> dict[str, Any]:
    """The result: same-work suites and their means (the headline); fused rows, and the
    residual epilogue's rows, when there are any, under ``fused`` and ``residual`` with means
    of their own."""
    all_rows = [r for _, rows in rows_by_suite for r in rows]
    result = {"format": RESULT_FORMAT, "tool": "convgen bench", **meta}
    result["suites"] = [{"name": name, "rows": rows, "summary": summarize(rows)} for name, rows in rows_by_suite]
    result["summary"] = summarize(all_rows)
    for key, variant, by_suite in (("fused", FUSED, fused_by_suite), ("residual", RESIDUAL, residual_by_suite)):
        result[key] = None
        if by_suite:
            apart = [r for _, rows in by_suite for r in rows]
            result[key] = {
                "label": LABELS[variant],
                "suites": [{"name": name, "rows": rows, "summary": summarize(rows)} for name, rows in by_suite],
                "summary": summarize(apart),
            }
    return result


def group(items: Sequence[Item], rows: Sequence[dict[str, Any]], variant: str = SAME
          ) -> list[tuple[str, list[dict[str, Any]]]]:
    """The rows of one variant by suite, in run order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for it, r in zip(items, rows):
        if it.variant == variant:
            groups.setdefault(it.suite, []).append(r)
    return list(groups.items())
