"""Probe: run a GPU fuzz test's strategy one example at a time, printing each before it runs.

A Hypothesis test that hangs on the GPU, or fails and then shrinks for minutes, reports
nothing before its time limit kills it.  This draws examples from the test's own
strategies under the loaded profile (the same distribution; not the test's very draws,
which Hypothesis seeds from the test function itself: for those, run the test with
``-s --hypothesis-verbosity=verbose``, which prints each example before trying it), and
runs and checks them in order, printing each example, then its time and error, with a
device sync in between and no shrinking; run it under ``timeout`` and the last example
printed without a result is the one that hung.

    timeout 120 python3 benchmarks/probes/fuzz_replay.py --test test_fuzz_tma_dgrad
    HYPOTHESIS_PROFILE=gpu-wide HYPOTHESIS_MAX_EXAMPLES=80 timeout 300 python3 benchmarks/probes/fuzz_replay.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

TESTS = Path(__file__).resolve().parents[2] / "tests"
sys.path.insert(0, str(TESTS))

import conftest  # noqa: E402,F401  - registers and loads the Hypothesis profiles
import test_tma_gpu as T  # noqa: E402
from gpu_helpers import check, run_pass  # noqa: E402
from hypothesis import given, settings, strategies as st  # noqa: E402

from convgen.ir import Pass  # noqa: E402

# The fuzz tests' strategies and calls, as test_tma_gpu writes them.
CASES = {
    "test_fuzz_tma_dgrad": (Pass.DGRAD, dict(problem=T.tma_dgrad_problems(), plan=st.sampled_from(T.DGRAD_PLANS)), {}),
    "test_fuzz_tma": (Pass.FPROP, dict(problem=T.tma_problems(), plan=st.sampled_from(T.TMA_PLANS)),
                      dict(bias=True, relu=True)),
    "test_fuzz_tma_wgrad": (Pass.WGRAD, dict(problem=T.tma_problems(k=st.integers(1, 20).map(lambda i: 8 * i)),
                                             plan=st.sampled_from(T.WGRAD_PLANS)), {}),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--test", choices=sorted(CASES), default="test_fuzz_tma_dgrad")
    args = ap.parse_args()
    pass_, strategies, extra = CASES[args.test]
    examples = []

    @settings(settings.default)
    @given(**strategies, seed=st.integers(0, 2**32 - 1))
    def draw(problem, plan, seed):
        examples.append((problem, plan, seed))

    draw()
    print(f"{len(examples)} examples of {args.test} ({settings.default})", flush=True)
    import cupy as cp

    import convgen.runtime

    convgen.runtime.POISON_OUTPUTS = True  # as the tests' poison_outputs fixture: unwritten outputs are NaN
    failed = 0
    for i, (problem, plan, seed) in enumerate(examples):
        print(f"[{i}] {problem.describe()} n={problem.n} {plan.brief()} ...", end=" ", flush=True)
        t0 = time.perf_counter()
        try:
            res = run_pass(problem, pass_, np.random.default_rng(seed), plan=plan, **extra)
            cp.cuda.Device().synchronize()
            check(res, "float16", what=f"{pass_.value} {problem.describe()} {plan.brief()}")
            print(f"ok {time.perf_counter() - t0:.1f} s", flush=True)
        except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
            failed += 1
            print(f"FAILED {time.perf_counter() - t0:.1f} s: {type(exc).__name__}: {str(exc)[:400]}", flush=True)
    print(f"{failed} of {len(examples)} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
