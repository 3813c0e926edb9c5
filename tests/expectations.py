"""Expected values written out independently of the code under test, shared by test files."""

from __future__ import annotations

import math

from convgen.ir import Pass


def expected_grid_x(spec) -> str:
    """The manifest's grid.x formula, written out independently of convgen.emit.Launch."""
    g, bm = spec.geometry, spec.plan.block_m
    if spec.plan.tile_w:  # halo path: a block per `tiles` tiles of tile_h x tile_w output pixels
        th, tw = bm // spec.plan.tile_w, spec.plan.tile_w
        out_h, out_w = (g.p, g.q) if spec.pass_ is Pass.FPROP else (g.h, g.w)
        return f"ceil(batch * {math.ceil(out_h / th) * math.ceil(out_w / tw)} / {spec.plan.tiles})"
    if spec.pass_ is Pass.FPROP:
        return f"ceil(batch * {g.p * g.q} / {bm})"
    if spec.pass_ is Pass.DGRAD:  # one run of tiles per stride residue class
        sh, sw = g.stride
        rows = math.ceil(g.h / sh) * math.ceil(g.w / sw)
        return (f"{sh * sw} * " if sh * sw > 1 else "") + f"ceil(batch * {rows} / {bm})"
    return f"ceil({g.k} / {bm})"
