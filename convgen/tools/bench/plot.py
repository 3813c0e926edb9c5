"""The plot of a `convgen bench` result: speedup per layer and pass, one panel per suite.

Bars are the GPU-time speedup (host hidden), black ticks the eager-loop speedup; the
fused comparison, when the run has one, gets panels of its own, titled as such, after the
same-work panels.  A convgen-only run plots floor/convgen time instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ...ir import Pass
from .rows import mismatch


def _panels(result: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    panels = [(s["name"] + "  (same work)", s) for s in result["suites"] if s["rows"]]
    fused = result.get("fused") or {}
    panels += [(s["name"] + "  (fused bias+ReLU vs conv2d+relu; dW+db)", s)
               for s in fused.get("suites", []) if s["rows"]]
    residual = result.get("residual") or {}
    panels += [(s["name"] + "  (fused bias+residual+ReLU vs relu(conv2d + r))", s)
               for s in residual.get("suites", []) if s["rows"]]
    return panels


def plot(result: dict[str, Any], path: Path | str) -> Path:
    """Grouped bars per layer and pass, one panel per suite (and per fused suite), log-scale
    y, a line at 1.0: the speedup over cuDNN, or (a convgen-only run) floor/convgen."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    panels = _panels(result)
    have_speedup = any(r.get("speedup") is not None for _, s in panels for r in s["rows"])

    def value(r: dict[str, Any]) -> Optional[float]:
        if have_speedup:
            return r.get("speedup")
        of = r.get("over_floor")
        return None if not of else 1.0 / of

    ylabel = "speedup vs cuDNN (cuDNN / convgen)" if have_speedup else "floor / convgen time"
    nl = max([len({r["layer"] for r in s["rows"]}) for _, s in panels] + [1])
    n = max(len(panels), 1)
    fig, axes = plt.subplots(n, 1, figsize=(max(7.0, 1.0 * nl + 2.5), 3.6 * n), squeeze=False)
    colors = {"fprop": "#4c72b0", "dgrad": "#dd8452", "wgrad": "#55a868"}
    for ax, (title, s) in zip(axes[:, 0], panels):
        layers: list[str] = []
        for r in s["rows"]:
            if r["layer"] not in layers:
                layers.append(r["layer"])
        passes = [p.value for p in Pass if any(r["pass"] == p.value for r in s["rows"])]
        width = 0.8 / max(len(passes), 1)
        allv: list[float] = []
        eager_marked = False
        for j, p in enumerate(passes):
            xs, ys, bad, ex, ey = [], [], [], [], []
            for r in s["rows"]:
                if r["pass"] != p:
                    continue
                x = layers.index(r["layer"]) + (j - (len(passes) - 1) / 2) * width
                v = value(r)
                if v is not None:
                    xs.append(x)
                    ys.append(v)
                    bad.append(mismatch(r))
                if have_speedup and r.get("eager_speedup") is not None:
                    ex.append(x)
                    ey.append(r["eager_speedup"])
            # bars grow from 1.0: up where convgen is faster (or nearer the floor), down where not
            bars = ax.bar(xs, [y - 1.0 for y in ys], width, bottom=1.0, label=f"{p} GPU time", color=colors.get(p))
            for b, y, m in zip(bars, ys, bad):
                ax.annotate(f"{y:.2f}" + ("!" if m else ""), (b.get_x() + b.get_width() / 2, y),
                            ha="center", va="bottom" if y >= 1 else "top", fontsize=6,
                            color="red" if m else "black")
            if ey:
                ax.scatter(ex, ey, marker="_", s=120, color="black", zorder=3,
                           label=None if eager_marked else "eager time")
                eager_marked = True
            allv.extend(ys + ey)
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
        ge = s["summary"].get("eager_speedup", {}).get("all") if have_speedup else None
        ax.set_title(title + (f"  geomean GPU {g:.2f}" if g is not None else "")
                     + (f", eager {ge:.2f}" if ge is not None else ""), fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.legend(fontsize=7)
    gpu = (result.get("gpu") or {}).get("name") or ""
    commit = (result.get("git") or {}).get("commit") or ""
    fig.suptitle(f"convgen vs cuDNN  {gpu}  {result.get('date', '')}  {commit}".strip(), fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
