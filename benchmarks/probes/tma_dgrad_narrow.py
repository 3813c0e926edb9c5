"""Probe: which dy channel counts (dgrad's K) can the TMA loop's im2col maps of dy take?

The strided-dgrad fuzz hung on a stride-1 layer with K = 8 (dy rows of 16 bytes under
64-channel boxes), the same layer with K = 40 ran.  This runs dgrad through the TMA loop
on a few layers over K = 8..64, each in its own process under a time limit (a hung
kernel is a process to kill, not an exception), and prints ok / FAILED / HUNG per case.

    python3 benchmarks/probes/tma_dgrad_narrow.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASE = r"""
import sys; sys.path[:0] = [{root!r}, {tests!r}]
import numpy as np, cupy as cp, convgen.runtime
from convgen.ir import ConvProblem, Pass, Plan
from convgen.mainloop import TmaWgmma
from gpu_helpers import check, run_pass
convgen.runtime.POISON_OUTPUTS = True
import convgen.tma_rules; convgen.tma_rules.MIN_DGRAD_K = 8  # the probe runs what the planner refuses
p = ConvProblem(*{args}, n={n})
plan = Plan(128, 128, 64, 8, 1, 5, 8, 8, loop=TmaWgmma())
res = run_pass(p, Pass.DGRAD, np.random.default_rng(0), plan=plan)
cp.cuda.Device().synchronize()
check(res, "float16", what=p.describe())
"""
LAYERS = [  # (h, w, c, k, r, s, stride, padding, dilation), n
    ((3, 16, 40, None, 4, 1, 1, (2, 0), 1), 3),  # the fuzz's layer
    ((8, 8, 64, None, 1, 1, 1, 0, 1), 2),        # pointwise
    ((8, 8, 64, None, 3, 3, 1, 1, 1), 2),        # 3x3
]


def _run(a: tuple, n: int) -> str:
    code = CASE.format(root=str(ROOT), tests=str(ROOT / "tests"), args=a, n=n)
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "HUNG (killed after 30 s)"
    return "ok" if r.returncode == 0 else "FAILED " + (r.stderr.strip().splitlines() or ["?"])[-1][:200]


def main() -> int:
    from concurrent.futures import ThreadPoolExecutor

    cases = [(tuple(k if v is None else v for v in args), n) for args, n in LAYERS for k in (8, 16, 24, 32, 48, 64)]
    with ThreadPoolExecutor(6) as pool:  # six processes at a time: hung ones wait out their limit together
        verdicts = list(pool.map(lambda c: _run(*c), cases))
    for (a, n), v in zip(cases, verdicts):
        print(f"K={a[3]:3d} {a} n={n}: {v}", flush=True)
    return 1 if any(v != "ok" for v in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
