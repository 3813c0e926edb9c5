"""Emission: a :class:`KernelSpec` in, CUDA or HIP source text out.

Rendering is pure: the same spec gives byte-identical source (no timestamps, no
dict-order or hash-seed dependence), which keeps ``generated/`` reviewable and
the compile cache effective.  Everything the launcher needs (kernel names,
argument order, grid, block, shared memory, workspace sizes) is returned with the
source, so no other module has to know the templates' conventions.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import jinja2

from . import __version__
from .backends import Backend, backend_for
from .ir import KernelSpec, Pass
from .planner import (
    EPI_PAD, HALO_LD, a_is_col, b_is_col, drain_group, flat_grid, halo_images, halo_path, halo_pixels, halo_shape, stage_pad,
    ring_stages, smem_bytes, staged_halo_halves,
)
from .resources import templates_dir

_C_TYPES = {"float16": "half_t", "float32": "float"}


@dataclass(frozen=True)
class Launch:
    """One kernel launch of a convolution call, with its grid as a function of the batch."""

    kernel: str
    args: tuple[str, ...]  # argument names, in order; "batch" and "m_rows" are ints
    block: tuple[int, int, int]
    shared_mem: int
    # grid.x = grid_groups * ceil(rows / grid_m_tile), rows = batch * grid_rows_per_image
    # (or grid_fixed_rows when the GEMM's M does not scale with the batch).  dgrad has one
    # group per stride residue class.  The split-K reduction's "rows" are its outputs.
    grid_m_tile: int
    grid_n_tiles: int
    grid_z: int
    grid_rows_per_image: int = 0
    grid_fixed_rows: int = 0
    grid_groups: int = 1

    def grid_x(self, batch: int) -> int:
        rows = batch * self.grid_rows_per_image if self.grid_rows_per_image else self.grid_fixed_rows
        return self.grid_groups * max(1, -(-rows // self.grid_m_tile))


@dataclass(frozen=True)
class KernelSource:
    spec: KernelSpec
    source: str
    filename: str
    main: Launch
    reduce: Launch | None  # the split-K reduction, when plan.split_k > 1
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def compile_arch(self) -> str:
        """The arch NVRTC compiles for: wgmma needs the arch-specific "sm_90a" features
        (its cubin runs on sm_90 parts only, which the plan check already demands)."""
        return self.spec.target.arch + ("a" if self.spec.plan.wgmma else "")

    @property
    def kernel_names(self) -> tuple[str, ...]:
        return (self.main.kernel,) + ((self.reduce.kernel,) if self.reduce else ())

    def grid(self, batch: int) -> tuple[int, int, int]:
        """The main kernel's grid for ``batch``: the batch is a run-time argument."""
        return (self.main.grid_x(batch), self.main.grid_n_tiles, self.main.grid_z)

    def workspace_elems(self, batch: int) -> int:
        """fp32 elements of split-K workspace for ``batch`` (0 without split-K)."""
        if not self.reduce:
            return 0
        g = self.spec.geometry.gemm(self.spec.pass_, batch)
        return self.main.grid_z * g.m * g.n

    def manifest_entry(self) -> dict[str, Any]:
        launches = [self.main] + ([self.reduce] if self.reduce else [])
        return {
            "file": self.filename,
            "spec": self.spec.as_dict(),
            "key": self.spec.key,
            "plan_reasons": list(self.spec.plan.reasons),
            "kernels": [
                {
                    "name": l.kernel, "args": list(l.args), "block": list(l.block),
                    "shared_mem": l.shared_mem,
                    "grid": {
                        "x": (f"{l.grid_groups} * " if l.grid_groups > 1 else "")
                        + (f"ceil(batch * {l.grid_rows_per_image} / {l.grid_m_tile})" if l.grid_rows_per_image
                           else f"ceil({l.grid_fixed_rows} / {l.grid_m_tile})"),
                        "y": l.grid_n_tiles, "z": l.grid_z,
                    },
                }
                for l in launches
            ],
        }


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def _row_map(vec: int, rows: int, cols: int, threads: int) -> bool:
    """Whether a scalar im2col gather can give each thread whole rows (templates' RowMap):
    the threads must tile the rows, and the lanes sharing a row must split its columns evenly."""
    if vec != 1:
        return False
    if threads >= rows:
        return threads % rows == 0 and cols % (threads // rows) == 0
    return rows % threads == 0


def _context(spec: KernelSpec, be: Backend) -> dict[str, Any]:
    p, plan = spec.pass_, spec.plan
    threads = plan.warps * be.warp_size
    gemm = spec.geometry.gemm(p, 1)
    reads = {"a": _C_TYPES[plan.read_a], "b": _C_TYPES[plan.read_b]}
    split = plan.split_k > 1
    imgs = halo_images(plan, spec.geometry, p)  # 1 unless an 8-wide halo tile stacks whole images
    return {
        "name": spec.name,
        "reduce_name": spec.name + "_reduce",
        "a_col": a_is_col(p),
        "b_col": b_is_col(p),
        "smem_pad": stage_pad(plan),
        "epi_pad": EPI_PAD,
        "drain_group": drain_group(plan, be.warp_size),
        "smem_bytes": smem_bytes(plan, p, be.warp_size, spec.geometry),
        "ring": ring_stages(plan, p, spec.geometry),
        "halo_ld": HALO_LD,
        "halo": plan.halo,
        "halo_path": halo_path(plan, spec.geometry, p),
        "staged_halo": staged_halo_halves(plan, spec.geometry) if plan.halo and not plan.flat else 0,
        "halo_tiles": plan.tiles,
        "warps_k": plan.warps_k,
        # wgmma: the accumulator registers per m64 step (BN / 2).  B's transpose flag is
        # `not b_col` (dgrad's [BK][BN] weights are stored N-major).
        "wgmma": plan.wgmma,
        "wgmma_regs": plan.block_n // 2,
        # (tile rows, tile columns, halo rows, halo columns) of a 2-D tile; a flat tile's grid
        # (rows, columns per image) and halo pixels; and whether the taps walk the halo
        # flipped (dgrad reads dy at h + PH - r*DH).
        "halo_tile": halo_shape(plan, spec.geometry, imgs) if plan.tile_w else (0, 0, 0, 0),
        # Whole images stacked in one 8-pixel-wide tile (planner.halo_images), 1 otherwise.
        "halo_imgs": imgs,
        "halo_flat": plan.flat,
        # A 2-D tile narrower than a fragment: the halo MMAs load each row through ldmatrix.
        "halo_ldsm": plan.tile_w % 16 != 0,
        "flat_grid": flat_grid(spec.geometry, p) if plan.flat else (0, 0),
        "halo_pix": halo_pixels(plan, spec.geometry, p) if plan.halo else 0,
        "halo_flip": p is Pass.DGRAD,
        "gemm_n": gemm.n,
        "gemm_n_axis": gemm.n_axis,
        "ta": reads["a"],
        "tb": reads["b"],
        # cp.async moves 4, 8 or 16 bytes of fp16; scalar and fp32 gathers go through registers.
        "async_a": be.cp_async and plan.read_a == "float16" and plan.vec_a >= 2,
        "async_b": be.cp_async and plan.read_b == "float16" and plan.vec_b >= 2,
        # The im2col-like operands (fprop's and dgrad's A, wgrad's B) of a scalar gather.
        "rowmap_a": p is not Pass.WGRAD and _row_map(plan.vec_a, plan.block_m, plan.block_k, threads),
        "rowmap_b": p is Pass.WGRAD and _row_map(plan.vec_b, plan.block_k, plan.block_n, threads),
        "out_t": _C_TYPES[spec.epilogue.out_dtype],
        "split": split,
        "bias_add": spec.epilogue.bias and p is Pass.FPROP,
        "relu": spec.epilogue.relu,
        "db": spec.epilogue.bias and p is Pass.WGRAD,
        "reduce_rows": REDUCE_ROWS,
        "reduce_ways": reduce_ways(plan.split_k),
        "reduce_vec": reduce_vec(gemm.n),
        "reduce_db_vec": reduce_vec(spec.geometry.k),
    }


def _args(spec: KernelSpec, k: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
    p = spec.pass_
    if p is Pass.FPROP:
        main = ("x", "w") + (("bias",) if k["bias_add"] else ()) + ("y", "workspace", "batch")
        out = "y"
    elif p is Pass.DGRAD:
        main = ("dy", "w", "dx", "workspace", "batch")
        out = "dx"
    else:
        main = ("x", "dy", "dw") + (("db", "db_workspace") if k["db"] else ()) + ("workspace", "batch")
        out = "dw"
    if not k["split"]:
        return main, None
    reduce = (
        ("workspace",) + (("bias",) if k["bias_add"] else ()) + (out,)
        + (("db_workspace", "db") if k["db"] else ()) + ("m_rows",)
    )
    return main, reduce


REDUCE_ROWS = 8  # rows of a reduction block; an output gets up to this many, one per slice residue
REDUCE_BLOCK = (32, REDUCE_ROWS, 1)  # 32 lanes side by side: coalesced rows of the workspace


def reduce_ways(slices: int) -> int:
    """Rows of the reduction block per output: one per slice up to REDUCE_ROWS (powers of
    two), so that a few slices leave no row idle and many keep 8 x 4 loads in flight."""
    ways = 1
    while ways * 2 <= min(slices, REDUCE_ROWS):
        ways *= 2
    return ways


def reduce_vec(n: int) -> int:
    """Outputs a reduction thread sums: 4 (one 16-byte load per slice) when runs of 4 never
    straddle a row of N and every slice stays 16-byte aligned."""
    return 4 if n % 4 == 0 else 1


def reduce_outputs_per_block(split_k: int, n: int) -> int:
    return REDUCE_BLOCK[0] * reduce_vec(n) * (REDUCE_ROWS // reduce_ways(split_k))


def emit(spec: KernelSpec) -> KernelSource:
    be = backend_for(spec.target)
    k = _context(spec, be)
    template = _environment().get_template(f"{spec.pass_.value}.j2")
    source = template.render(
        # Only the plan's fields, not its reasons: reasons quote the batch the plan was made
        # for, which is not part of the kernel (the same spec must give the same source).
        spec=spec, be=be, k=k, version=__version__, plan_text=spec.plan.explain().splitlines()[0]
    )
    plan = spec.plan
    gemm_n = k["gemm_n"]
    main_args, reduce_args = _args(spec, k)
    g = spec.geometry
    if plan.flat:  # one block per block_m positions of the flat grid (times its tiles)
        gh, gw = flat_grid(g, spec.pass_)
        rows = dict(grid_rows_per_image=gh * gw)
    elif plan.halo:  # one block per pixel tile of one image
        th, tw, _, _ = halo_shape(plan, g)
        out_h, out_w = (g.p, g.q) if spec.pass_ is Pass.FPROP else (g.h, g.w)
        rows = dict(grid_rows_per_image=math.ceil(out_h / th) * math.ceil(out_w / tw))
    elif spec.pass_ is Pass.FPROP:
        rows = dict(grid_rows_per_image=g.p * g.q)
    elif spec.pass_ is Pass.DGRAD:  # one group of tiles per stride residue class
        sh, sw = g.stride
        rows = dict(grid_rows_per_image=math.ceil(g.h / sh) * math.ceil(g.w / sw), grid_groups=sh * sw)
    else:
        rows = dict(grid_fixed_rows=g.k)
    main = Launch(
        kernel=k["name"],
        args=main_args,
        block=(plan.warps * be.warp_size, 1, 1),
        shared_mem=smem_bytes(plan, spec.pass_, be.warp_size, g),
        # a 2-D halo block computes `tiles` pixel tiles; a flat one `tiles` runs of block_m positions
        grid_m_tile=(plan.block_m * plan.tiles if plan.flat else plan.tiles * k["halo_imgs"] if plan.halo
                     else plan.block_m),
        grid_n_tiles=math.ceil(gemm_n / plan.block_n),
        grid_z=plan.split_k,
        **rows,
    )
    reduce = None
    if reduce_args:
        # One block per run of outputs, so every load of the reduction is issued at once;
        # its "rows" are the M x N outputs (M = the batch's pixels, or wgrad's fixed K).
        outputs = g.gemm(spec.pass_, 1).m * gemm_n
        per_image = dict(grid_fixed_rows=outputs) if spec.pass_ is Pass.WGRAD else dict(grid_rows_per_image=outputs)
        reduce = Launch(
            kernel=k["reduce_name"], args=reduce_args, block=REDUCE_BLOCK, shared_mem=0,
            grid_m_tile=reduce_outputs_per_block(plan.split_k, gemm_n), grid_n_tiles=1, grid_z=1, **per_image,
        )
    return KernelSource(
        spec=spec,
        source=source,
        filename=f"{spec.name}.{be.file_ext}",
        main=main,
        reduce=reduce,
        metadata={"convgen_version": __version__, "backend": be.name},
    )
