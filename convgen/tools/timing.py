"""How convgen's tools time GPU work: one module, shared by `convgen bench` and `convgen tune`.

Three measurements, each on one stream, all through a small device interface (``sync``,
``spin``, ``flush``, ``event``, ``record``, ``done``, ``elapsed_us``) so the loops run
against a fake device in the CPU tests:

* :func:`time_interleaved`, GPU time with the host hidden: per rep ``[spin] [L2 flush]
  start-event op end-event``, nothing synchronised until the end.  The spin keeps the GPU
  queue behind the host, so no launch gap is timed; the flush makes every rep read its
  inputs from HBM.  Several ops alternate A B A B, so drift falls on all alike.
* :func:`eager_per_call`, what a user's eager loop sees: N calls back to back, wall clock
  from a synchronised start to a final synchronise, divided by N.  Host cost and GPU time
  overlap here as they do in a real loop; whichever is larger sets the number.
* :func:`host_overhead`, the host's cost of one call: N calls while a spin kernel holds the
  GPU, so no GPU work and no waiting on it is in the number.

:class:`CudaDevice` is the real device (CuPy events, a memset for the flush, a ``clock64``
spin kernel, an empty kernel for the launch floor).  Nothing here imports CuPy at import.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

L2_FLUSH_BYTES = 256 << 20
MIN_SPIN_US = 20.0  # per-rep spin before the flush: keeps the GPU queue ahead of the host
TUNE_SPIN_US = 100.0  # tune's spin: longer than one convgen call's host cost (~25 us)

_SPIN_SRC = r"""
extern "C" __global__ void convgen_bench_spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""

_EMPTY_SRC = r"""
extern "C" __global__ void convgen_bench_empty() { }
"""


def time_interleaved(dev: Any, ops: Sequence[tuple[str, Callable[[], Any]]], reps: int, *,
                     flush: bool = True, spin_us: float = MIN_SPIN_US, head_start_us: float = 2000.0) -> dict[str, list[float]]:
    """Per-rep GPU times (us) of each op, reps interleaved: A B A B ...

    Every rep is [spin] [L2 flush] start-event op end-event, all on one stream and
    enqueued without synchronising, so only the op lies between its events; the
    spin keeps the GPU behind the host, so no host launch gap is ever timed.
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


def eager_per_call(dev: Any, fn: Callable[[], Any], calls: int,
                   clock: Callable[[], float] = time.perf_counter) -> float:
    """Microseconds per call of `calls` calls back to back, as an eager loop runs them:
    the wall clock from a synchronised start to the synchronise after the last call
    (its GPU work included), divided by `calls`.  No flush and no spin: nothing but the
    calls is in the interval."""
    dev.sync()
    t0 = clock()
    for _ in range(calls):
        fn()
    dev.sync()
    return (clock() - t0) / calls * 1e6


def eager_interleaved(dev: Any, ops: Sequence[tuple[str, Callable[[], Any]]], calls: int, trials: int,
                      clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """:func:`eager_per_call` `trials` times per op, the ops alternating A B A B."""
    out: dict[str, list[float]] = {name: [] for name, _ in ops}
    for _ in range(trials):
        for name, fn in ops:
            out[name].append(eager_per_call(dev, fn, calls, clock))
    return out


def median_gpu_us(dev: Any, fn: Callable[[], Any], reps: int, spin_us: float = TUNE_SPIN_US) -> float:
    """Median GPU time of `fn` by :func:`time_interleaved` (spin, L2 flush, events): how
    `convgen tune` times a candidate, the same method as `convgen bench`."""
    fn()  # warm: module load and first-touch allocations stay out of the samples
    return statistics.median(time_interleaved(dev, [("op", fn)], reps, spin_us=spin_us)["op"])


class CudaDevice:
    """The stream everything runs on, CUDA events, the L2 flush, a spin kernel and an
    empty kernel (the launch floor: what CuPy's launch of a kernel that does nothing costs)."""

    def __init__(self, cupy: Any, stream: Any, flush_bytes: int = L2_FLUSH_BYTES) -> None:
        import numpy as np

        self.cp, self.np, self.stream = cupy, np, stream
        self._l2 = cupy.empty(flush_bytes, dtype=cupy.uint8)
        self._spin = cupy.RawKernel(_SPIN_SRC, "convgen_bench_spin")
        self._empty = cupy.RawKernel(_EMPTY_SRC, "convgen_bench_empty")
        self.cycles_per_us = self._calibrate()

    def sync(self) -> None:
        self.cp.cuda.Device().synchronize()

    def flush(self) -> None:
        self._l2.fill(0)

    def spin(self, us: float) -> None:
        if us > 0:
            self._spin((1,), (1,), (self.np.int64(us * self.cycles_per_us),))

    def empty(self) -> None:
        """Launch the empty kernel: one block of one thread, no arguments."""
        self._empty((1,), (1,), ())

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
