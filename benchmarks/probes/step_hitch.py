"""Is a one-off host stall inside examples/train_step.py's timed window what made its eager
convgen figure 6.1-7.3 ms/step at --steps 50 but 2.5 ms/step at --steps 400, or after 200
warm-up steps (H100, 2026-12-05, commit 7428884)?  And is the stall Python's garbage collector?

Run on the GPU machine: `python3 benchmarks/probes/step_hitch.py gc|nogc`.  Runs the example's
eager mode (50 steps) with a gc callback that records every collection's generation and
duration; `nogc` runs it with the collector off.  Prints the collections over 5 ms.  The
example now collects before each side's window (2c13320): if the collector was the stall,
both modes give convgen about 2.5 ms/step and the long collections fall outside the windows;
if `gc` still shows 6-7 ms, something else stalls."""
import gc
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import train_step  # noqa: E402

events = []
_t0 = [0.0]


def _timed(phase: str, info: dict) -> None:
    if phase == "start":
        _t0[0] = time.perf_counter()
    else:
        events.append((info["generation"], 1e3 * (time.perf_counter() - _t0[0]), info["collected"]))


mode = sys.argv[1] if len(sys.argv) > 1 else "gc"
gc.callbacks.append(_timed)
if mode == "nogc":
    gc.disable()
train_step.main(["--modes", "eager", "--steps", "50"])
slow = [f"gen{g} {ms:.1f} ms ({n} freed)" for g, ms, n in events if ms > 5]
print(f"{mode}: {len(events)} collections, {sum(g == 2 for g, _, _ in events)} of generation 2; over 5 ms: {slow}")
