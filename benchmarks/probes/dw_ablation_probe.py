"""Probe: where a depthwise fprop kernel's time goes, by taking parts of its work away.  It
wraps the runtime's emitter in this process only and edits each depthwise fprop kernel's
source as ABLATE says:

- ``none``: the kernel as emitted (the baseline);
- ``nostage``: no halo is copied after a block's first tiles (each later tile computes on what
  its ring buffer already holds), so the time left is the stencil's, its syncs and stores;
- ``halftaps``: the stencil walks the first half of the filter rows ((R + 1) / 2) and still
  copies every halo, so the time it saves is the loop's share;
- ``both``: the two together.

The outputs are wrong in every form but ``none`` (the bench says so per row; only the times
count).  Run each setting with its own CONVGEN_CACHE_DIR and --out, and read the rows' GPU
times side by side (scripts/bench_compare.py with the baseline as A):

    ABLATE=halftaps CONVGEN_TUNED=0 CONVGEN_CACHE_DIR=/tmp/ab-h python3 benchmarks/probes/dw_ablation_probe.py \\
        bench --suite convnext-dw --pass fprop --out /tmp/ab-h

If ``halftaps`` saves about half the time, the filter loop bounds the kernel (its FFMAs, its
conversions, its shared-memory reads: benchmarks/NOTES.md, forty-fourth session); if
``nostage`` saves most of it, the halo copies do."""
import dataclasses
import os
import sys

import convgen.runtime as rt
from convgen.ir import Pass

ABLATE = os.environ.get("ABLATE", "none")
if ABLATE not in ("none", "nostage", "halftaps", "both"):
    sys.exit(f"dw_ablation_probe: ABLATE must be none, nostage, halftaps or both, got {ABLATE!r}")

# The lines of templates/kernels/depthwise fprop's tile loop this probe edits; if the template
# changes them, the probe stops rather than time an unedited kernel under an ablation's name.
STAGE = "    if (AHEAD > 0) stage(tile + AHEAD);"
ROWS = "    for (int r = 0; r < R; ++r) {"
EDITS = {"nostage": [(STAGE, "    if (AHEAD > 0) cp_async_commit();  // ablated: no copy")],
         "halftaps": [(ROWS, "    for (int r = 0; r < (R + 1) / 2; ++r) {  // ablated: half the filter rows")]}
EDITS["both"] = EDITS["nostage"] + EDITS["halftaps"]

_emit = rt.emit


def ablate(source: str) -> str:
    for old, new in EDITS.get(ABLATE, []):
        if source.count(old) != 1:
            sys.exit(f"dw_ablation_probe: expected one line {old.strip()!r} in the depthwise fprop kernel, found "
                     f"{source.count(old)}: the template changed")
        source = source.replace(old, new)
    return source


def emit(spec):
    ks = _emit(spec)
    if ABLATE != "none" and spec.pass_ is Pass.FPROP and spec.plan.loop.flags().depthwise:
        ks = dataclasses.replace(ks, source=ablate(ks.source))
    return ks


rt.emit = emit

if __name__ == "__main__":
    from convgen.cli import main

    sys.exit(main(sys.argv[1:]))
