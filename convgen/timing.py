"""GPU timing shared by `convgen bench` and `convgen tune`.

Small conv layers run for 10-40 us, about as long as the Python that launches them.
Timing ``record(start); fn(); record(end)`` then measures the host, not the kernel:
the GPU idles between the two events while Python prepares the launch.  So before
each timed call the stream is given a spin kernel long enough to cover the host
work; the events then bracket GPU work only.  Each repetition first overwrites a
buffer larger than L2, so every run starts with cold caches, as in training.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable

L2_FLUSH_BYTES = 256 * 2**20  # H200 L2 is 60 MB; 256 MB evicts it several times over
SPIN_CYCLES = 200_000  # ~100 us at ~2 GHz: longer than one convgen or cuDNN host call


class GpuTimer:
    """Times callables that enqueue GPU work on the current CuPy stream."""

    def __init__(self, flush_bytes: int = L2_FLUSH_BYTES, spin_cycles: int = SPIN_CYCLES) -> None:
        import cupy

        self._cp = cupy
        self._flush = cupy.empty(flush_bytes, dtype=cupy.uint8)
        self.spin_cycles = spin_cycles
        self._spin = cupy.RawKernel(
            r"""
            extern "C" __global__ void convgen_spin(long long cycles) {
              const long long start = clock64();
              while (clock64() - start < cycles) {}
            }""",
            "convgen_spin",
        )

    def flush_l2(self) -> None:
        self._flush.fill(0)

    def spin(self) -> None:
        import numpy as np

        self._spin((1,), (1,), (np.int64(self.spin_cycles),))

    def time_us(self, fn: Callable[[], Any], reps: int = 30, warmup: int = 3, flush: bool = True) -> float:
        """Median GPU time of one call of `fn`, in microseconds."""
        return statistics.median(self.samples_us(fn, reps, warmup, flush))

    def samples_us(self, fn: Callable[[], Any], reps: int = 30, warmup: int = 3, flush: bool = True) -> list[float]:
        cp = self._cp
        for _ in range(warmup):
            fn()
        out = []
        for _ in range(reps):
            if flush:
                self.flush_l2()
            self.spin()
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(cp.cuda.get_elapsed_time(start, end) * 1000.0)
        return out
