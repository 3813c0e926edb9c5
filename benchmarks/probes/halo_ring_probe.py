"""Probe: `convgen bench` (or any convgen command) with the depthwise stencil's default ring of
halo buffers set by RING (2: the next tile's halo copied while one is computed; 3: the next
two), to time the two side by side in one session.  It sets convgen.depthwise.STENCIL_RING in
this process only; run it once per RING, with separate CONVGEN_CACHE_DIRs and --out folders:

    RING=2 CONVGEN_TUNED=0 CONVGEN_CACHE_DIR=/tmp/ring2 python3 benchmarks/probes/halo_ring_probe.py \\
        bench --suite mobilenetv2-dw --pass fprop --out /tmp/ring2

(benchmarks/NOTES.md, twenty-ninth session.)"""
import os
import sys

import convgen.depthwise

convgen.depthwise.STENCIL_RING = int(os.environ.get("RING", convgen.depthwise.STENCIL_RING))

if __name__ == "__main__":
    from convgen.cli import main

    sys.exit(main(sys.argv[1:]))
