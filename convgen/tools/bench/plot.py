"""The plot of a `convgen bench` result: speedup per layer and pass, one panel per suite."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ...ir import Pass
from .rows import mismatch

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
