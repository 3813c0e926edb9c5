"""How a kernel computes one pass (:class:`Plan`), and everything a generated kernel
depends on (:class:`KernelSpec`), whose hash names its files and cache entries.

Apart from the shape IR (:mod:`convgen.ir`) because a plan is a choice, the planner's or the
tuner's or a user's, while the shape is a given: a plan is checked against a shape, never
part of it.  Frozen and validated at construction, as the IR is.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from ._valid import as_int as _int
from .dtypes import check_dtypes, resolve_mma_dtype
from .ir import DTYPES, ConvGeometry, ConvProblem, DType, Epilogue, Pass, Target
from .mainloop import (FRAG, KINDS, Depthwise, FlatHalo, Flags, HaloLdsm, HaloTile, Im2col, MainLoop, StagedHalo,
                       TmaHalo, TmaWgmma, Wgmma)


def stages_whole_halo(geometry: "ConvGeometry", pass_: "Pass | str") -> bool:
    """Whether a 2-D halo tile of this layer is a :class:`StagedHalo`: fprop with C not a
    multiple of 8 (a 3-channel first layer), whose channels cannot be read in 16-byte runs."""
    return Pass.parse(pass_) is Pass.FPROP and geometry.c % 8 != 0


def from_flags(tile_w: Any = 0, tiles: Any = 1, flat: Any = False, warps_k: Any = 1, wgmma: Any = False,
               tma: Any = False, persistent: Any = False, pingpong: Any = False, depthwise: Any = 0,
               dw_rows: Any = 0, halo_pitch: Any = 0, cluster: Any = 1, dw_interleave: Any = False,
               tma_store: Any = False, dw_out_rows: Any = 1, dw_mma: Any = False, *,
               staged: bool = False) -> MainLoop:
    """The kind a plan dict's fields name (the inverse of :meth:`MainLoop.flags`, kept with
    :meth:`Plan.from_dict`, the format's reader).  ``staged``: whether the layer stages its whole
    halo (fprop, C not a multiple of 8), which the dict does not record: there a 2-D tile
    is a :class:`StagedHalo`, elsewhere a :class:`HaloTile` (or :class:`HaloLdsm` when
    narrower than a fragment)."""
    for name, v in (("flat", flat), ("wgmma", wgmma), ("tma", tma), ("persistent", persistent), ("pingpong", pingpong),
                    ("dw_interleave", dw_interleave), ("tma_store", tma_store), ("dw_mma", dw_mma)):
        if not isinstance(v, bool):
            raise TypeError(f"plan.{name} must be a bool, got {v!r}")
    tile_w, tiles, warps_k = _int("plan.tile_w", tile_w), _int("plan.tiles", tiles), _int("plan.warps_k", warps_k)
    if _int("plan.cluster", cluster) != 1 and (not tma or _int("plan.halo_pitch", halo_pitch)):
        raise ValueError(f"plan.cluster={cluster} launches the TMA main loop's blocks as clusters: it needs "
                         "plan.tma=True and no halo_pitch")
    if tma_store and (not tma or _int("plan.halo_pitch", halo_pitch)):
        raise ValueError("plan.tma_store=True stores the TMA main loop's output through the copy engine: it needs "
                         "plan.tma=True and no halo_pitch")
    if _int("plan.halo_pitch", halo_pitch):
        if not tma or wgmma or flat or tile_w or persistent or pingpong or warps_k != 1 or tiles != 1 or depthwise:
            raise ValueError(f"plan.halo_pitch={halo_pitch} names the TMA halo loop: tma=True and no other flag")
        return TmaHalo(halo_pitch)
    if dw_interleave and not _int("plan.depthwise", depthwise):
        raise ValueError("plan.dw_interleave=True orders a depthwise stencil's blocks: it needs plan.depthwise > 0")
    if _int("plan.dw_rows", dw_rows) and not _int("plan.depthwise", depthwise):
        raise ValueError(f"plan.dw_rows={dw_rows} splits a depthwise wgrad's filter rows: it needs plan.depthwise > 0")
    if dw_mma and not _int("plan.depthwise", depthwise):
        raise ValueError("plan.dw_mma=True runs a depthwise stencil on mma.sync: it needs plan.depthwise > 0")
    if _int("plan.dw_out_rows", dw_out_rows) != 1 and not _int("plan.depthwise", depthwise):
        raise ValueError(f"plan.dw_out_rows={dw_out_rows} is a depthwise thread's rows of pixels: it needs "
                         "plan.depthwise > 0")
    if _int("plan.depthwise", depthwise):
        if flat or wgmma or tma or persistent or pingpong or warps_k != 1:
            raise ValueError(f"plan.depthwise={depthwise} names the depthwise stencil alone, with its tile_w and tiles")
        return Depthwise(tile_w, depthwise, dw_rows, tiles, dw_interleave, dw_out_rows, dw_mma)
    if tile_w < 0 or tile_w % 8:
        raise ValueError(f"plan.tile_w={tile_w} must be 0 (no halo tile) or a multiple of 8")
    halo = bool(tile_w) or flat
    if wgmma and (halo or warps_k != 1 or tiles != 1):
        raise ValueError(f"plan.wgmma=True takes no halo tile and no sliced K, got tile_w={tile_w}, flat={flat}, "
                         f"tiles={tiles}, warps_k={warps_k}")
    if halo and warps_k != 1:
        raise ValueError(f"plan.warps_k={warps_k} needs an im2col plan (tile_w=0, flat=False): a halo step's "
                         "fragments are spread over the taps, not over block_k")
    if flat and tile_w:
        raise ValueError(f"plan.flat=True takes tile_w=0, got tile_w={tile_w}: a flat tile is block_m consecutive "
                         "positions of the batch's grid, not a tile_w-wide rectangle")
    if tiles != 1 and not halo:
        raise ValueError(f"plan.tiles={tiles} must be 1 without a halo tile (tile_w > 0 or flat)")
    if tma and (wgmma or halo or warps_k != 1 or tiles != 1):
        raise ValueError(f"plan.tma=True names the TMA main loop alone, got wgmma={wgmma}, tile_w={tile_w}, "
                         f"flat={flat}, tiles={tiles}, warps_k={warps_k}")
    if persistent and not tma:
        raise ValueError("plan.persistent=True names a persistent TMA main loop: it needs plan.tma=True")
    if pingpong and not persistent:
        raise ValueError("plan.pingpong=True names a persistent ping-pong TMA main loop: it needs plan.persistent=True")
    if tma:
        return TmaWgmma(persistent, pingpong, _int("plan.cluster", cluster), tma_store)
    if wgmma:
        return Wgmma()
    if flat:
        return FlatHalo(tiles)
    if tile_w % FRAG:
        return HaloLdsm(tile_w, tiles)
    if tile_w and staged:
        if tiles != 1:
            raise ValueError(f"plan.tiles={tiles}: a layer that stages its whole halo (fprop, C not a multiple "
                             "of 8) computes one tile per block")
        return StagedHalo(tile_w)
    if tile_w:
        return HaloTile(tile_w, tiles)
    return Im2col(warps_k)


_PLAN_INTS = ("block_m", "block_n", "block_k", "warps_m", "warps_n", "stages", "vec_a", "vec_b", "split_k")
# Where split-K's slices are summed: "kernel", a second launch (the reduction kernel), or
# "grid", the main kernel's own last phase after a grid-wide barrier (a cooperative launch,
# every block resident at once), which saves a launch's host time and the gap between two.
SPLIT_REDUCES = ("kernel", "grid")


@dataclass(frozen=True)
class Plan:
    """How a kernel computes its GEMM.  Made by :func:`convgen.planner.plan`, or by hand.

    block_m x block_n is the output tile of one block, block_k the reduction step per
    pipeline stage; warps_m x warps_n warps each own a warp tile of (block_m/warps_m) x
    (block_n/warps_n), i.e. several 16x16 fragments.  vec_a/vec_b are the gather widths in
    elements (8 fp16 = one 16-byte load); read_a/read_b the dtype the gather reads (float32
    is cast in the gather).  ``loop`` is the main-loop kind (:mod:`convgen.mainloop`), with
    its own parameters: im2col from global memory (optionally with sliced K), wgmma, or one
    of the halo tiles.

    ``split_reduce`` says where split-K's slices (or stream-K's parts of cut tiles) are summed:
    "kernel" (a second launch) or "grid" (the main kernel itself, after a grid-wide barrier;
    wgrad on CUDA).

    ``dataclasses.replace(plan, loop=HaloTile(32))`` changes the kind.  A plan's dict
    (:meth:`as_dict`, the tuning database's format and part of every spec key) writes the
    kind in the flag fields plans had before kinds were types; :meth:`from_dict` reads them.
    """

    block_m: int
    block_n: int
    block_k: int
    warps_m: int
    warps_n: int
    stages: int
    vec_a: int
    vec_b: int
    read_a: DType = "float16"
    read_b: DType = "float16"
    split_k: int = 1
    loop: MainLoop = Im2col()
    split_reduce: str = "kernel"
    reasons: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        for name in _PLAN_INTS:
            v = _int(name, getattr(self, name))
            if v < 1:
                raise ValueError(f"plan.{name} must be >= 1, got {v}")
            object.__setattr__(self, name, v)
        grid = getattr(self.loop, "warp_grid", True)  # a bad loop is refused below, with its own message
        # (a loop with no warp grid, the depthwise stencil, counts block_m in whole runs of its own pixels)
        for name in ("block_m", "block_n", "block_k") if grid else ("block_n", "block_k"):
            v = getattr(self, name)
            if v % 16:
                raise ValueError(f"plan.{name} must be a multiple of 16 (the fragment size), got {v}")
        if grid and self.block_m % (16 * self.warps_m):
            raise ValueError(
                f"plan.block_m={self.block_m} does not split into warps_m={self.warps_m} warp tiles of 16-row fragments"
            )
        if grid and self.block_n % (16 * self.warps_n):
            raise ValueError(
                f"plan.block_n={self.block_n} does not split into warps_n={self.warps_n} warp tiles of 16-column fragments"
            )
        for name in ("vec_a", "vec_b"):
            if getattr(self, name) not in (1, 2, 4, 8):
                raise ValueError(f"plan.{name} must be 1, 2, 4 or 8 elements, got {getattr(self, name)}")
        for name in ("read_a", "read_b"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"plan.{name} must be one of {DTYPES}, got {getattr(self, name)!r}")
        if not 2 <= self.stages <= 8:
            raise ValueError(
                f"plan.stages must be between 2 and 8, got {self.stages}: the pipeline overlaps "
                "the next tile's loads with this tile's MMAs, which needs at least two buffers"
            )
        if self.split_reduce not in SPLIT_REDUCES:
            raise ValueError(f"plan.split_reduce must be one of {SPLIT_REDUCES}, got {self.split_reduce!r}")
        stream_k = isinstance(self.loop, TmaWgmma) and self.loop.persistent  # (in wgrad: planner.check_plan)
        if self.split_reduce != "kernel" and self.split_k == 1 and not stream_k:
            raise ValueError(f"plan.split_reduce={self.split_reduce!r} sums split-K slices (or stream-K's parts, "
                             "TmaWgmma(persistent=True) in wgrad): it needs split_k > 1 or that loop")
        if not isinstance(self.loop, MainLoop) or type(self.loop) is MainLoop:
            raise TypeError(f"plan.loop must be a main-loop kind ({', '.join(k.__name__ for k in KINDS)}), "
                            f"got {self.loop!r}")
        self.loop.check(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any], geometry: "ConvGeometry | None" = None, pass_: "Pass | str | None" = None,
                  *, reasons: tuple[str, ...] = ()) -> "Plan":
        """The plan :meth:`as_dict` wrote (a tuning-database entry).  A 2-D halo tile's dict
        does not say whether it stages the whole halo (:class:`StagedHalo`) or reads taps in
        place (:class:`HaloTile`): the layer does (:func:`stages_whole_halo`), so give the
        geometry and pass where the plan will run; without them it reads as a HaloTile."""
        unknown = set(d) - set(PLAN_KEYS)
        if unknown:
            raise ValueError(f"plan dict has unknown keys {sorted(unknown)}; known: {', '.join(PLAN_KEYS)}")
        common = {k: v for k, v in d.items() if k not in Flags._fields}  # split_reduce among them
        staged = geometry is not None and pass_ is not None and stages_whole_halo(geometry, pass_)
        loop = from_flags(**{k: v for k, v in d.items() if k in Flags._fields}, staged=staged)
        return cls(**common, loop=loop, reasons=reasons)

    # -- the emitter's view: today's flag fields, derived from the kind -----------------
    # convgen/emit.py and the templates read these; the planner and tuner read `loop`.
    @property
    def tile_w(self) -> int:
        """Emitter's view: the 2-D halo tile's width, 0 for im2col, wgmma and flat plans."""
        return self.loop.flags().tile_w

    @property
    def tiles(self) -> int:
        """Emitter's view: pixel tiles one block computes in turn (1 unless a halo kind says more)."""
        return self.loop.flags().tiles

    @property
    def flat(self) -> bool:
        """Emitter's view: whether the kind is :class:`FlatHalo`."""
        return self.loop.flags().flat

    @property
    def warps_k(self) -> int:
        """Emitter's view: the K slices of an :class:`Im2col` plan (1 for every other kind)."""
        return self.loop.flags().warps_k

    @property
    def wgmma(self) -> bool:
        """Emitter's view: whether the kind is :class:`Wgmma`."""
        return self.loop.flags().wgmma

    @property
    def halo(self) -> bool:
        """Emitter's view: whether the kind stages a halo (any halo tile, flat or 2-D)."""
        return self.loop.halo

    @property
    def warps(self) -> int:
        """Warps of the block (threads / warp size): every K slice's, and a TMA loop's producers."""
        return self.warps_m * self.warps_n * self.warps_k + self.loop.producer_warps

    @property
    def tma(self) -> bool:
        """Emitter's view: whether the copy engine reads the inputs through tensor maps (the
        TMA kinds, :class:`~convgen.mainloop.TmaWgmma` and :class:`~convgen.mainloop.TmaHalo`)."""
        return self.loop.flags().tma

    @property
    def warp_tile(self) -> tuple[int, int]:
        return (self.block_m // self.warps_m, self.block_n // self.warps_n)

    @property
    def fragments(self) -> tuple[int, int]:
        wm, wn = self.warp_tile
        return (wm // 16, wn // 16)

    def as_dict(self) -> dict[str, Any]:
        """The shared fields, then the kind's flags that differ from an im2col plan's:
        plans keep the keys they had before each kind existed, so old specs, caches and
        tuning entries still match."""
        d: dict[str, Any] = {name: getattr(self, name) for name in PLAN_KEYS[:11]}
        for name, value in self.loop.flags()._asdict().items():
            if value != Flags._field_defaults[name]:
                d[name] = value
        if self.split_reduce != "kernel":  # likewise: plans from before it existed keep their dicts
            d["split_reduce"] = self.split_reduce
        return d

    def layout(self) -> str:
        """The halo tile in a table cell: " halo16", " flat", "x2" for two tiles per block,
        and " wgmma"; empty for a WMMA im2col plan."""
        return self.loop.layout()

    def brief(self) -> str:
        """One table cell: tile, warps, stages, split-K, and the halo tile if any."""
        return (f"{self.block_m}x{self.block_n}x{self.block_k} w{self.warps_m}x{self.warps_n}"
                + (f"x{self.warps_k}" if self.warps_k > 1 else "") + f" s{self.stages} k{self.split_k}"
                + ("g" if self.split_reduce == "grid" else "") + self.layout())

    def explain(self) -> str:
        return "\n".join([self.loop.headline(self), *(f"  - {r}" for r in self.reasons)])


# A plan dict's keys, in as_dict's order: the shared fields, the kind's flags, then where
# split-K is summed (written only when not by the reduction kernel).
PLAN_KEYS: tuple[str, ...] = ("block_m", "block_n", "block_k", "warps_m", "warps_n", "stages", "vec_a", "vec_b",
                              "read_a", "read_b", "split_k", *Flags._fields, "split_reduce")


SPEC_FORMAT = 1  # bump when the meaning of a spec's fields changes


@dataclass(frozen=True)
class KernelSpec:
    """Everything a generated kernel depends on; its hash names files and cache entries."""

    geometry: ConvGeometry
    pass_: Pass
    epilogue: Epilogue
    in_dtype: DType
    target: Target
    plan: Plan
    mma_dtype: DType | None = None  # the MMA's 16-bit input type; None: in_dtype's (convgen/dtypes.py)
    # wgrad of a layer whose groups run packed, ``pack`` to a slab (convgen/group_pack.py):
    # ``geometry`` is the slabs' layer, and the kernel writes dW in the layer's own layout
    # (each filter's C / groups / pack channels), so no copy has to follow it.
    pack: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.geometry, ConvProblem):  # drop the batch: it is a run-time argument
            object.__setattr__(self, "geometry", self.geometry.geometry)
        object.__setattr__(self, "pass_", Pass.parse(self.pass_))
        if isinstance(self.pack, bool) or not isinstance(self.pack, int) or self.pack < 1:
            raise ValueError(f"pack must be a positive integer, got {self.pack!r}")
        if self.pack > 1:
            g = self.geometry
            if self.pass_ is not Pass.WGRAD:
                raise ValueError(f"pack={self.pack}: only wgrad writes packed groups' outputs in place "
                                 "(fprop and dgrad read block-diagonal weights copied before them)")
            if g.depthwise or (g.c // g.groups) % self.pack or (g.k // g.groups) % self.pack:
                raise ValueError(f"pack={self.pack} must divide each slab's {g.c // g.groups} channels and "
                                 f"{g.k // g.groups} filters (a layer of {g.groups} slabs, not depthwise)")
        if self.in_dtype not in DTYPES:
            raise ValueError(f"in_dtype must be one of {DTYPES}, got {self.in_dtype!r}")
        object.__setattr__(self, "mma_dtype", resolve_mma_dtype(self.in_dtype, self.mma_dtype))
        check_dtypes(self.in_dtype, self.mma_dtype, self.epilogue.out_dtype, self.epilogue.bias_dtype)
        self.epilogue.check_pass(self.pass_)

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": SPEC_FORMAT,
            "pass": self.pass_.value,
            "geometry": self.geometry.as_dict(),
            "epilogue": self.epilogue.as_dict(),
            "in_dtype": self.in_dtype,
            "target": self.target.as_dict(),
            "plan": self.plan.as_dict(),
            # only where not float16, so every earlier kernel keeps its key, name and cache entries
            **({"mma_dtype": self.mma_dtype} if self.mma_dtype != "float16" else {}),
            **({"pack": self.pack} if self.pack > 1 else {}),
        }

    @property
    def key(self) -> str:
        blob = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def name(self) -> str:
        """The kernel's C name, read from its configuration as CUTLASS names its kernels:
        pass, main-loop kind (its tag), block tile, stages and arch, then the shape (H x W,
        C, K, R x S, stride, padding, dilation), e.g.
        ``convgen_fprop_halo16x2_128x64x32_s3_sm90_32x32_c64_k64_3x3_s11_p11_d11_1a2b3c4d``.
        A grouped layer adds ``_g{groups}``, and packed groups' wgrad ``x{pack}`` after it. The
        key's first 8 hex digits keep apart specs that share all of those (epilogue, dtypes,
        warps, gather widths, split-K)."""
        g, p = self.geometry, self.plan
        return (
            f"convgen_{self.pass_.value}_{p.loop.tag}_{p.block_m}x{p.block_n}x{p.block_k}_s{p.stages}"
            f"_{self.target.arch.replace('_', '')}"
            f"_{g.h}x{g.w}_c{g.c}_k{g.k}_{g.r}x{g.s}"
            f"_s{g.stride[0]}{g.stride[1]}_p{g.padding[0]}{g.padding[1]}"
            f"_d{g.dilation[0]}{g.dilation[1]}" + (f"_g{g.groups}" if g.groups > 1 else "")
            + (f"x{self.pack}" if self.pack > 1 else "") + f"_{self.key[:8]}"
        )
