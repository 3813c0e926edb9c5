"""Probe: `convgen bench` with every depthwise kernel's ``__launch_bounds__(THREADS)`` made
``__launch_bounds__(THREADS, 1)`` (LB1=1), to time ptxas's register choice against the
emitted one.  It wraps the runtime's emitter in this process only; run it twice, with LB1=0
and LB1=1 and separate CONVGEN_CACHE_DIRs, and compare the rows:

    LB1=1 CONVGEN_TUNED=0 CONVGEN_CACHE_DIR=/tmp/lb1 python3 benchmarks/probes/launch_bounds_probe.py \\
        bench --suite mobilenetv2-dw --layers dw192-28px-s2,dw96-112px-s2 --pass fprop

(benchmarks/NOTES.md, twenty-eighth session: dw192-28px-s2 fprop 28.0 -> 25.6 us, 101 registers
and no local memory; dw96-112px-s2 unchanged.)"""
import dataclasses
import os
import sys

import convgen.runtime as rt

_emit = rt.emit


def emit(spec):
    ks = _emit(spec)
    if os.environ.get("LB1") == "1" and "__launch_bounds__(THREADS)" in ks.source and "depthwise" in ks.source:
        ks = dataclasses.replace(ks, source=ks.source.replace("__launch_bounds__(THREADS)", "__launch_bounds__(THREADS, 1)"))
    return ks


rt.emit = emit

if __name__ == "__main__":
    from convgen.cli import main

    sys.exit(main(sys.argv[1:]))
