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
from dataclasses import dataclass
from typing import Any

import jinja2

from . import __version__
from .targets import Arch
from . import stream_k, tma_halo
from .reduction import REDUCE_BLOCK, REDUCE_ROWS, reduce_outputs_per_block, reduce_vec, reduce_ways
from .ir import ConvGeometry, Pass
from .spec import KernelSpec
from .footprint import (
    EPI_PAD, HALO_LD, a_is_col, b_is_col, drain_group, flat_grid, halo_images, halo_path, halo_pixels, halo_shape, stage_pad,
    resident_blocks, ring_stages, smem_bytes, staged_halo_halves, TMA_HALO_BARRIER_BYTES, TMA_HALO_TAIL_BYTES,
    TMA_HALO_WEIGHT_BYTES, TMA_STORE_WARP_BYTES, tma_halo_box_bytes,
)
from .depthwise import facts as dw_facts
from .emit_context import Context, Epilogue, Gathers, Halo, HaloBox, Shape, SplitK, Tile, elem_type
from .mainloop import Depthwise, TmaHalo, TmaWgmma
from .residues import residue_classes
from .resources import templates_dir

# half_t is the kernel's one 16-bit type (fp16 or bf16: spec.mma_dtype, convgen/dtypes.py).
_C_TYPES = {"float16": "half_t", "bfloat16": "half_t", "float32": "float"}


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
    # A persistent kernel's grid is one row of at most this many blocks (those the GPU
    # holds at once), which walk the grid_x * grid_n_tiles tiles themselves; 0: one per tile.
    grid_blocks: int = 0
    # A cooperative launch (cuLaunchCooperativeKernel): every block resident at once, so the
    # kernel may wait at a grid-wide barrier (split-K summed in the main kernel).
    cooperative: bool = False
    # Stream-K (wgrad's persistent TMA loop): always grid_blocks blocks, which share every
    # tile's steps between them, however many tiles there are.
    stream_k: bool = False
    # Blocks a thread-block cluster (the kernel's __cluster_dims__), side by side along grid.x:
    # grid.x is a whole number of clusters, a last block past the M tiles computing rows past
    # the batch (zeros in, nothing stored) so that its partner's multicasts have a home.  A
    # persistent grid walks the tiles a cluster's worth at a time.
    grid_cluster: int = 1

    def grid_x(self, batch: int) -> int:
        rows = batch * self.grid_rows_per_image if self.grid_rows_per_image else self.grid_fixed_rows
        return self.grid_groups * max(1, -(-rows // self.grid_m_tile))

    def grid(self, batch: int) -> tuple[int, int, int]:
        if self.stream_k:
            return (self.grid_blocks, 1, 1)
        cl = self.grid_cluster
        m_tiles = -(-self.grid_x(batch) // cl) * cl
        if self.grid_blocks:
            return (min(m_tiles * self.grid_n_tiles, max(cl, self.grid_blocks // cl * cl)), 1, self.grid_z)
        return (m_tiles, self.grid_n_tiles, self.grid_z)


@dataclass(frozen=True)
class KernelSource:
    spec: KernelSpec
    source: str
    filename: str
    main: Launch
    reduce: Launch | None  # the split-K reduction, when plan.split_k > 1

    @property
    def compile_arch(self) -> str:
        """The arch NVRTC compiles for: wgmma needs the arch-specific "sm_90a" features
        (its cubin runs on sm_90 parts only, which the plan check already demands)."""
        return self.spec.target.arch + ("a" if self.spec.plan.wgmma or self.spec.plan.tma else "")

    @property
    def kernel_names(self) -> tuple[str, ...]:
        return (self.main.kernel,) + ((self.reduce.kernel,) if self.reduce else ())

    def grid(self, batch: int) -> tuple[int, int, int]:
        """The main kernel's grid for ``batch``: the batch is a run-time argument."""
        return self.main.grid(batch)

    def workspace_elems(self, batch: int) -> int:
        """fp32 elements of split-K workspace for ``batch`` (0 without split-K): stream-K's
        is a BM x BN slot for each part of a tile, at most tiles + blocks - 1 of them."""
        if self.main.stream_k:
            return self._stream_k.slots * self.spec.plan.block_m * self.spec.plan.block_n
        if self.spec.plan.split_k == 1:
            return 0
        g = self.spec.geometry.gemm(self.spec.pass_, batch)
        return self.main.grid_z * g.m * g.n // self.spec.pack  # packed groups: each filter's own columns

    @property
    def _stream_k(self) -> stream_k.StreamK:
        return stream_k.layout(self.spec.plan, self.spec.geometry, self.spec.target, self.spec.name)

    def db_workspace_elems(self, batch: int) -> int:
        """fp32 elements of db's workspace (wgrad with db, split-K or stream-K; else 0): a
        slice's K sums, or a stream-K part's BM."""
        if "db_workspace" not in self.main.args:
            return 0
        if self.main.stream_k:
            return self._stream_k.slots * self.spec.plan.block_m
        return self.main.grid_z * self.spec.geometry.k if self.spec.plan.split_k > 1 else 0

    def manifest_entry(self) -> dict[str, Any]:
        launches = [self.main] + ([self.reduce] if self.reduce else [])
        return {
            "file": self.filename,
            "compile_arch": self.compile_arch,  # what nvcc or NVRTC must target (sm_90a for wgmma and TMA)
            "spec": self.spec.as_dict(),
            "key": self.spec.key,
            "plan_reasons": list(self.spec.plan.reasons),
            "kernels": [
                {
                    "name": l.kernel, "args": list(l.args), "block": list(l.block),
                    "shared_mem": l.shared_mem,
                    "grid": _grid_text(l),
                    **({"cooperative": True} if l.cooperative else {}),
                }
                for l in launches
            ],
        }


def _grid_text(l: Launch) -> dict[str, Any]:
    """A launch's grid as the manifest writes it, for a launcher written in another language."""
    x = ((f"{l.grid_groups} * " if l.grid_groups > 1 else "")
         + (f"ceil(batch * {l.grid_rows_per_image} / {l.grid_m_tile})" if l.grid_rows_per_image
            else f"ceil({l.grid_fixed_rows} / {l.grid_m_tile})"))
    if l.stream_k:
        return {"x": str(l.grid_blocks), "y": 1, "z": 1}
    cl = l.grid_cluster
    if cl > 1:  # whole clusters: x rounded up to them, the blocks a persistent grid holds down
        x = f"ceil({x} / {cl}) * {cl}"
    if l.grid_blocks:
        return {"x": f"min({x} * {l.grid_n_tiles}, {max(cl, l.grid_blocks // cl * cl)})", "y": 1, "z": l.grid_z}
    return {"x": x, "y": l.grid_n_tiles, "z": l.grid_z}


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


def _kind(spec: KernelSpec) -> str:
    plan, path = spec.plan, halo_path(spec.plan, spec.geometry, spec.pass_)
    if isinstance(plan.loop, TmaHalo):
        return "tma_halo"
    if isinstance(plan.loop, Depthwise):
        return "depthwise"
    if path == "im2col":
        return "staged_halo"
    if path == "taps":
        return "halo_flat" if plan.flat else "halo_ldsm" if plan.tile_w % 16 else "halo"
    return "tma" if plan.tma else "im2col_wgmma" if plan.wgmma else "im2col"


def _banner(spec: KernelSpec) -> tuple[str, ...]:
    # Only the plan's fields, not its reasons: reasons quote the batch the plan was made
    # for, which is not part of the kernel (the same spec must give the same source).
    return (
        f"Generated by convgen {__version__}. Do not edit: regenerate with `convgen emit`.",
        f"spec {spec.key}: {spec.pass_.value} {spec.geometry.describe()}",
        f"  in {spec.in_dtype}, out {spec.epilogue.out_dtype}, bias {str(spec.epilogue.bias).lower()}, "
        f"relu {str(spec.epilogue.relu).lower()}"
        + (", gelu true" if spec.epilogue.gelu else "") + (", residual true" if spec.epilogue.residual else ""),
        f"  target {spec.target.arch} ({spec.target.backend}, {spec.target.sm_count} SMs)",
        spec.plan.explain().splitlines()[0],
    )


def _context(spec: KernelSpec, be: Arch) -> Context:
    """The templates' one input.  Every derived fact is computed here, once, from the plan
    and the planner's helpers, so no template re-derives one (or reads the plan itself)."""
    p, plan, g = spec.pass_, spec.plan, spec.geometry
    threads = plan.warps * be.warp_size
    gemm = g.gemm(p, 1)  # the output's (every group's columns)
    kind = _kind(spec)
    side = 1 if kind == "depthwise" else g.groups  # GEMMs side by side: the depthwise kind has none
    block_gemm = g.group_gemm(p, 1) if side > 1 else gemm  # what a block tiles
    halo = None
    if plan.halo:
        imgs = halo_images(plan, g, p)  # 1 unless an 8-wide halo tile stacks whole images
        halo = Halo(
            ld=HALO_LD,
            tile=halo_shape(plan, g, imgs) if plan.tile_w else (0, 0, 0, 0),
            imgs=imgs,
            flat_grid=flat_grid(g, p) if plan.flat else (0, 0),
            pix=halo_pixels(plan, g, p),
            flip=p is Pass.DGRAD,
            staged_halves=staged_halo_halves(plan, g) if kind == "staged_halo" else 0,
            tiles=plan.tiles,
        )
    split = None
    if plan.split_k > 1:
        out_n = gemm.n // spec.pack  # packed groups' slices hold each filter's own columns
        in_kernel = plan.split_reduce == "grid"
        # In the main kernel the summing warps are its first ones, up to REDUCE_ROWS: a TMA
        # kernel's consumers (its producer warpgroup holds few registers after setmaxnreg).
        rows = min(REDUCE_ROWS, plan.warps - plan.loop.producer_warps) if in_kernel else REDUCE_ROWS
        ways = reduce_ways(plan.split_k)
        while rows % ways:
            ways //= 2
        split = SplitK(
            slices=plan.split_k, reduce_name=spec.name + "_reduce", rows=rows,
            ways=ways, vec=reduce_vec(out_n), db_vec=reduce_vec(g.k), out_n=out_n, in_kernel=in_kernel,
        )
    (sh, sw), (ph, pw), (dh, dw) = g.stride, g.padding, g.dilation
    return Context(
        name=spec.name,
        pass_=p.value,
        kind=kind,
        mma=("wgmma" if plan.wgmma or plan.tma else "ldsm" if kind == "halo_ldsm" else "none" if kind == "depthwise"
             else "wmma"),
        banner=_banner(spec),
        be=be,
        elem=elem_type(spec.mma_dtype or "float16", be),
        shape=Shape(h=g.h, w=g.w, c=g.c // side, k=g.k // side, r=g.r, s=g.s, p=g.p, q=g.q, sh=sh, sw=sw, ph=ph,
                    pw=pw, dh=dh, dw=dw, groups=side, c_pix=g.c, k_pix=g.k, pack=spec.pack),
        tile=Tile(
            block_m=plan.block_m, block_n=plan.block_n, block_k=plan.block_k, warps_m=plan.warps_m,
            warps_n=plan.warps_n, warps_k=plan.warps_k, stages=plan.stages, ring=ring_stages(plan, p, g),
            persistent=isinstance(plan.loop, TmaHalo) or isinstance(plan.loop, TmaWgmma) and plan.loop.persistent,
            pingpong=isinstance(plan.loop, TmaWgmma) and plan.loop.pingpong,
            cluster=plan.loop.cluster if isinstance(plan.loop, TmaWgmma) else 1,
            store_bytes=TMA_STORE_WARP_BYTES if isinstance(plan.loop, TmaWgmma) and plan.loop.tma_store else 0,
            pad=stage_pad(plan), a_col=a_is_col(p), b_col=b_is_col(p),
        ),
        gathers=Gathers(
            ta=_C_TYPES[plan.read_a],
            tb=_C_TYPES[plan.read_b],
            vec_a=plan.vec_a,
            vec_b=plan.vec_b,
            async_a=be.cp_async and plan.read_a != "float32" and plan.vec_a >= 2,
            async_b=be.cp_async and plan.read_b != "float32" and plan.vec_b >= 2,
            # The im2col-like operands (fprop's and dgrad's A, wgrad's B) of a scalar gather.
            rowmap_a=p is not Pass.WGRAD and _row_map(plan.vec_a, plan.block_m, plan.block_k, threads),
            rowmap_b=p is Pass.WGRAD and _row_map(plan.vec_b, plan.block_k, plan.block_n, threads),
        ),
        halo=halo,
        epi=Epilogue(
            out_t=_C_TYPES[spec.epilogue.out_dtype],
            bias_add=spec.epilogue.bias and p is Pass.FPROP,
            bias_t=_C_TYPES[spec.epilogue.bias_dtype],
            relu=spec.epilogue.relu,
            gelu=spec.epilogue.gelu,
            residual=spec.epilogue.residual,
            db=spec.epilogue.bias and p is Pass.WGRAD,
            drain_group=drain_group(plan, be.warp_size),
            pad=EPI_PAD,
        ),
        split=split,
        gemm_n=block_gemm.n,
        gemm_n_axis=block_gemm.n_axis,
        smem_bytes=smem_bytes(plan, p, be.warp_size, g),
        wgmma_regs=plan.block_n // 2,
        classes=residue_classes(g) if p is Pass.DGRAD and kind == "tma" else (),
        dw=dw_facts(plan, g, p, be.warp_size) if kind == "depthwise" else None,
        box=_halo_box(plan.loop, g, p) if isinstance(plan.loop, TmaHalo) else None,
        streamk=stream_k.layout(plan, g, spec.target, spec.name) if stream_k.applies(plan, p) else None,
    )


def _halo_box(loop: TmaHalo, g: ConvGeometry, p: Pass) -> HaloBox:
    th, tw = tma_halo.tile(loop.pitch)
    return HaloBox(pitch=loop.pitch, rows=th, cols=tw, box_bytes=tma_halo_box_bytes(loop.pitch),
                   tail_bytes=TMA_HALO_TAIL_BYTES, barrier_bytes=TMA_HALO_BARRIER_BYTES,
                   weight_bytes=TMA_HALO_WEIGHT_BYTES,
                   tiles_h=math.ceil(g.p / th), tiles_w=math.ceil(g.q / tw), slices=tma_halo.slices(g, p),
                   flip=p is Pass.DGRAD)


def _args(spec: KernelSpec, ctx: Context) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
    p, epi, tma = spec.pass_, ctx.epi, spec.plan.tma
    inputs = {Pass.FPROP: ("x", "w"), Pass.DGRAD: ("dy", "w"), Pass.WGRAD: ("x", "dy")}[p]
    if tma:  # the copy engine reads both inputs through tensor maps (convgen/tma.py)
        inputs = tuple(f"{name}_map" for name in inputs)
    out = {Pass.FPROP: "y", Pass.DGRAD: "dx", Pass.WGRAD: "dw"}[p]
    if ctx.tile.store_bytes:  # the copy engine writes y (dx) through a map of it too
        out += "_map"
    # A TMA fprop or dgrad reduces its whole K in one block: no split-K workspace.
    workspace = () if tma and p is not Pass.WGRAD else ("workspace",)
    epilogue = (("bias",) if epi.bias_add else ()) + (("residual", "alpha", "beta") if epi.residual else ())
    main = (inputs + epilogue + (out,) + (("db", "db_workspace") if epi.db else ()) + workspace + ("batch",))
    if ctx.streamk is not None and not ctx.streamk.in_kernel:
        return main, ("workspace", out) + (("db_workspace", "db") if epi.db else ()) + ("batch",)
    if ctx.split is None or ctx.split.in_kernel:
        return main, None
    reduce = (
        ("workspace",) + epilogue + (out,)
        + (("db_workspace", "db") if epi.db else ()) + ("m_rows",)
    )
    return main, reduce


def emit(spec: KernelSpec) -> KernelSource:
    be = spec.target.info
    ctx = _context(spec, be)
    source = _environment().get_template(ctx.template).render(ctx=ctx)
    plan = spec.plan
    gemm_n = ctx.gemm_n
    main_args, reduce_args = _args(spec, ctx)
    g = spec.geometry
    if ctx.box is not None:  # persistent blocks walk every tile of the batch (below)
        rows = dict(grid_rows_per_image=ctx.box.tiles_h * ctx.box.tiles_w)
    elif ctx.dw is not None:  # fprop, dgrad: one block per pixel tile; wgrad: per channel chunk and slice
        rows = (dict(grid_fixed_rows=g.c) if spec.pass_ is Pass.WGRAD
                else dict(grid_rows_per_image=ctx.dw.tiles_h * ctx.dw.tiles_w))
    elif plan.flat:  # one block per block_m positions of the flat grid (times its tiles)
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
        rows = dict(grid_fixed_rows=g.k // ctx.shape.groups)  # M = one group's filters
    main = Launch(
        kernel=ctx.name,
        args=main_args,
        block=(plan.warps * be.warp_size, 1, 1),
        shared_mem=ctx.smem_bytes,
        # a 2-D halo block computes `tiles` pixel tiles (or stacks of whole images); a flat
        # one `tiles` runs of block_m positions
        grid_m_tile=(1 if ctx.box else plan.block_m * plan.tiles if plan.flat else plan.tiles * ctx.halo.imgs if ctx.halo
                     else (plan.block_n if spec.pass_ is Pass.WGRAD else ctx.dw.tiles_pb) if ctx.dw else plan.block_m),
        grid_n_tiles=(ctx.box.slices if ctx.box else 1 if spec.pass_ is Pass.WGRAD and ctx.dw
                      else math.ceil(g.c / plan.block_n) if ctx.dw
                      else ctx.shape.groups * math.ceil(gemm_n / plan.block_n)),  # a grouped GEMM: groups x N tiles
        grid_z=plan.split_k,
        # a TMA halo grid is whole sets of its slices, at least one (every block has a slice to walk)
        grid_blocks=(ctx.streamk.blocks if ctx.streamk
                     else max(1, spec.target.sm_count // ctx.box.slices) * ctx.box.slices if ctx.box
                     else spec.target.sm_count * resident_blocks(plan, spec.pass_, spec.target, g)
                     if ctx.tile.persistent else 0),
        cooperative=any(r is not None and r.in_kernel for r in (ctx.split, ctx.streamk)),  # summed after a grid barrier
        stream_k=ctx.streamk is not None,
        grid_cluster=ctx.tile.cluster,
        **rows,
    )
    reduce = None
    if ctx.streamk is not None and not ctx.streamk.in_kernel:  # a thread per float4 of a tile's slots, every one at once
        sk = ctx.streamk
        reduce = Launch(kernel=sk.reduce_name, args=reduce_args, block=(sk.threads, 1, 1), shared_mem=0,
                        grid_m_tile=sk.threads, grid_n_tiles=1, grid_z=1,
                        grid_fixed_rows=sk.tiles * plan.block_m * plan.block_n // 4)
    if reduce_args and ctx.split is not None:
        # One block per run of outputs, so every load of the reduction is issued at once;
        # its "rows" are the M x N outputs (M = the batch's pixels, or wgrad's fixed K).
        outputs = g.gemm(spec.pass_, 1).m * ctx.split.out_n  # every group's outputs (packed groups': their own)
        per_image = dict(grid_fixed_rows=outputs) if spec.pass_ is Pass.WGRAD else dict(grid_rows_per_image=outputs)
        reduce = Launch(
            kernel=ctx.split.reduce_name, args=reduce_args, block=REDUCE_BLOCK, shared_mem=0,
            grid_m_tile=reduce_outputs_per_block(plan.split_k, ctx.split.out_n), grid_n_tiles=1, grid_z=1, **per_image,
        )
    return KernelSource(spec=spec, source=source, filename=f"{spec.name}.{be.file_ext}", main=main, reduce=reduce)
