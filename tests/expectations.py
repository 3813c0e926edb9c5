"""Expected values written out independently of the code under test, shared by test files."""

from __future__ import annotations

import math

from convgen.ir import Pass


def expected_stacked_images(spec) -> int:
    """Whole images one 8-pixel-wide halo tile stacks (planner.halo_images): a single-tile
    block whose tile is at least the image's width and a whole number of images tall."""
    p, g = spec.plan, spec.geometry
    if not p.tile_w or p.tile_w % 16 == 0 or p.tiles != 1:
        return 1
    th, tw = p.block_m // p.tile_w, p.tile_w
    out_h, out_w = (g.p, g.q) if spec.pass_ is Pass.FPROP else (g.h, g.w)
    return th // out_h if th > out_h and th % out_h == 0 and tw >= out_w else 1


def expected_grid_x(spec) -> str:
    """The manifest's grid.x formula, written out independently of convgen.emit.Launch."""
    g, bm = spec.geometry, spec.plan.block_m
    if spec.plan.tile_w:  # halo path: a block per `tiles` tiles (or stacks) of tile_h x tile_w output pixels
        th, tw = bm // spec.plan.tile_w, spec.plan.tile_w
        out_h, out_w = (g.p, g.q) if spec.pass_ is Pass.FPROP else (g.h, g.w)
        per_block = spec.plan.tiles * expected_stacked_images(spec)
        return f"ceil(batch * {math.ceil(out_h / th) * math.ceil(out_w / tw)} / {per_block})"
    if spec.pass_ is Pass.FPROP:
        return f"ceil(batch * {g.p * g.q} / {bm})"
    if spec.pass_ is Pass.DGRAD:  # one run of tiles per stride residue class
        sh, sw = g.stride
        rows = math.ceil(g.h / sh) * math.ceil(g.w / sw)
        return (f"{sh * sw} * " if sh * sw > 1 else "") + f"ceil(batch * {rows} / {bm})"
    return f"ceil({g.k} / {bm})"
