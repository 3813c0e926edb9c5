"""Main-loop kinds: how a kernel's reduction loop stages and multiplies its operands.

A :class:`~convgen.spec.Plan` holds one of these in ``plan.loop``; the fields every kind
shares (tile, warps, stages, gather widths, split-K) stay on the plan.  Each kind carries
only its own parameters, validates them where they are typed, and checks what it needs of
the plan's shared fields in :meth:`MainLoop.check`, so no combination of flags can name a
loop that does not exist.  What a kind needs of the layer and the target (stride, channel
runs, capabilities) is the planner's ``check_plan``.

The kinds:

- :class:`Im2col`: the im2col gather from global memory into a staged ring, WMMA MMAs;
  ``warps_k > 1`` slices each step's K over that many warp grids (CUTLASS's sliced K).
- :class:`Wgmma`: the same gathers, Hopper warpgroup MMAs reading both operands from
  shared memory through descriptors.
- :class:`TmaWgmma`: Hopper's own loop (sm_90a): the tensor memory accelerator copies both
  operands into a ring of swizzled stages, a producer warp hands each stage to consumer
  warpgroups through mbarriers, and they multiply it with asynchronous wgmma.
- :class:`TmaHalo`: Hopper's loop for 3x3 stride-1 layers that reduce 64 channels (sm_90a):
  the copy engine copies a tile's input halo once as one tiled box, and each filter tap's A
  operand is that halo started a few 128-byte rows in, so a pixel leaves L2 about twice, not
  nine times; a 64-channel slice of the taps' weights stays in shared memory, blocks are
  persistent.
- :class:`HaloTile`: a block computes a 2-D tile of one image's output pixels and stages
  the input pixels its taps reach (a halo) once per K-step; each tap's WMMA fragments are
  read in place from it.
- :class:`HaloLdsm`: a halo tile narrower than a 16-row fragment (8 pixels wide): each lane
  hands ldmatrix its own row address and the MMAs are raw ``mma.sync``.  A tile a whole
  number of images tall stacks those images (``footprint.halo_images``: derived from the
  geometry, since the plan's dict has no field for it).
- :class:`FlatHalo`: the batch laid out as one padded grid of positions
  (``footprint.flat_grid``); a block owns ``block_m`` consecutive ones and a tap is a fixed
  shift, whatever the image's width.
- :class:`StagedHalo`: fprop with C not a multiple of 8 (a 3-channel first layer): the block
  stages its whole input halo, every channel, once, and runs the im2col gather over that copy.
- :class:`Depthwise`: a depthwise layer (groups = C) has no GEMM worth a tensor core: each
  channel is its own R x S stencil.  The block stages a pixel tile's halo of block_n
  channels in shared memory, and each thread computes a run of output pixels for a vector
  of channels on the CUDA cores (convgen/depthwise.py plans it).

A kind's :attr:`~MainLoop.tag` is a short name derived from its configuration (CUTLASS
names its kernels this way).  :meth:`~MainLoop.flags` is the kind in the fields of a plan's
dict; ``Plan.as_dict`` uses it and ``Plan.from_dict`` reads it back
(:func:`convgen.spec.from_flags`, beside the dict format), so tuning databases and spec keys
keep their format.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from ._valid import as_int

if TYPE_CHECKING:  # pragma: no cover
    from .spec import Plan

FRAG = 16  # WMMA fragment edge (m16n16k16)


def fit_tile(extent: int, cap: int | None = None) -> int:
    """Smallest power-of-two tile >= extent (at least one fragment), capped at ``cap``."""
    t = FRAG
    while t < extent and (cap is None or t < cap):
        t *= 2
    return t


class Flags(NamedTuple):
    """A kind in the fields of a plan's dict (and of the emitter's view of a plan)."""

    tile_w: int = 0
    tiles: int = 1
    flat: bool = False
    warps_k: int = 1
    wgmma: bool = False
    tma: bool = False
    persistent: bool = False
    pingpong: bool = False
    depthwise: int = 0  # a Depthwise kind's pixels per thread (0: another kind)
    dw_rows: int = 0  # and, in wgrad, the filter rows a thread sums (0: all R)
    dw_interleave: bool = False  # and, in fprop and dgrad, its blocks ordered chunk first
    dw_out_rows: int = 1  # and a thread's rows: fprop's outputs with its filter in registers, wgrad's dy rows
    dw_mma: bool = False  # and, in fprop, its stencil on mma.sync (banded Toeplitz filter rows)
    halo_pitch: int = 0  # a TmaHalo kind's pitch (with tma=True; 0: another kind)
    cluster: int = 1  # a TmaWgmma kind's blocks a cluster (with tma=True)
    tma_store: bool = False  # a TmaWgmma kind stores its output through the copy engine (with tma=True)


def _positive(kind: str, name: str, value: Any) -> int:
    v = as_int(f"{kind}.{name}", value)
    if v < 1:
        raise ValueError(f"{kind}.{name} must be >= 1, got {v}")
    return v


@dataclass(frozen=True)
class MainLoop:
    """The base of the kinds; use one of its subclasses."""

    halo: ClassVar[bool] = False  # stages input pixels once for every tap (a halo tile)
    warp_grid: ClassVar[bool] = True  # warps_m x warps_n warps tile block_m x block_n in 16x16 fragments
    producer_warps: ClassVar[int] = 0  # warps on top of warps_m x warps_n that only copy operands

    @property
    def tag(self) -> str:
        raise NotImplementedError

    def check(self, plan: "Plan") -> None:
        """Reject a plan whose shared fields this kind cannot run, naming both."""

    def flags(self) -> Flags:
        raise NotImplementedError

    def layout(self) -> str:
        """The kind in a table cell after the tile (``Plan.brief``): empty for WMMA im2col."""
        return ""

    def describe(self, plan: "Plan") -> str:
        """The kind's part of ``Plan.explain``'s first line."""
        return ""

    def headline(self, plan: "Plan") -> str:
        """``Plan.explain``'s first line: the GEMM block, its warps, pipeline and gathers, then the kind's part."""
        return (f"block {plan.block_m}x{plan.block_n}x{plan.block_k}, {plan.warps} warps ({plan.warps_m}x{plan.warps_n}"
                + (f"x{plan.warps_k}, K sliced {plan.warps_k} ways" if plan.warps_k > 1 else "")
                + f", warp tile {plan.warp_tile[0]}x{plan.warp_tile[1]}), {plan.stages} stages, vec A/B "
                f"{plan.vec_a}/{plan.vec_b}, read A/B {plan.read_a}/{plan.read_b}, split-K {plan.split_k}"
                + ((" summed in the kernel" if plan.split_k > 1 else ", stream-K's cut tiles summed in the kernel")
                   if plan.split_reduce == "grid" else "") + self.describe(plan))


@dataclass(frozen=True)
class Im2col(MainLoop):
    """The im2col gather from global memory, WMMA MMAs.  warps_k > 1 slices each staged
    step's block_k across that many warp grids: a block with one long reduction gets
    warps_k times the warps to hide its latency, and the slices' sums meet in shared
    memory before the epilogue."""

    warps_k: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "warps_k", _positive("Im2col", "warps_k", self.warps_k))

    @property
    def tag(self) -> str:
        return "im2col" + (f"k{self.warps_k}" if self.warps_k > 1 else "")

    def check(self, plan: "Plan") -> None:
        if plan.block_k % (FRAG * self.warps_k):
            raise ValueError(f"plan.block_k={plan.block_k} does not split into Im2col.warps_k={self.warps_k} "
                             "slices of 16-deep fragments")

    def flags(self) -> Flags:
        return Flags(warps_k=self.warps_k)


@dataclass(frozen=True)
class Wgmma(MainLoop):
    """The im2col gathers with Hopper warpgroup MMAs: warps_m / 4 warpgroups (warps_n = 1),
    each computing block_m / (warps_m / 4) rows in m64 x block_n steps, both operands read
    from shared memory through descriptors."""

    @property
    def tag(self) -> str:
        return "wgmma"

    def check(self, plan: "Plan") -> None:
        if plan.warps_n != 1 or plan.warps_m % 4:
            raise ValueError(f"Wgmma needs whole warpgroups over M: plan.warps_n = 1 and plan.warps_m a multiple "
                             f"of 4, got {plan.warps_m}x{plan.warps_n}")

    def flags(self) -> Flags:
        return Flags(wgmma=True)

    def layout(self) -> str:
        return " wgmma"

    def describe(self, plan: "Plan") -> str:
        return f", wgmma on {plan.warps_m // 4} warpgroup(s)"


TMA_BLOCK_K = 64  # one 128-byte swizzle row of fp16 per pixel (or weight row) and stage


@dataclass(frozen=True)
class TmaWgmma(MainLoop):
    """Hopper's own main loop (sm_90a), as CUTLASS's warp-specialised collectives are built.
    The tensor memory accelerator copies both operands into a ring of ``plan.stages``
    128-byte-swizzled stages (the gathered activations in its im2col mode, so the copy engine
    does the gather and the padding; the other operand as tiles); one producer warp issues
    the copies and hands each stage over through an mbarrier; ``warps_m / 4`` consumer
    warpgroups each multiply 64 rows of the tile with asynchronous wgmma, keeping one step in
    flight while they wait for the next.  ``block_k`` is 64: one swizzle row of fp16.  fprop and dgrad
    reduce a tile's whole K in one block; wgrad splits its pixels (``split_k``, or stream-K)."""

    producer_warps: ClassVar[int] = 4  # a whole warpgroup, so setmaxnreg can move its registers
    # persistent: fprop's (or dgrad's) grid is as many blocks as run on the GPU at once, each walking
    # every gridDim.x-th tile, so the producer copies the next tile's first stages while the
    # consumers drain this one's (through scratch of their own, past the ring) and no block
    # is launched, or fills its ring, per tile.  In wgrad it is stream-K: that many blocks share
    # all the tiles' K-steps evenly, one contiguous run each, a tile cut between two or three
    # blocks summed by a reduction kernel (no split-K slices, no wave left part-empty).
    persistent: bool = False
    # pingpong (persistent only, two consumer warpgroups): each consumer warpgroup computes a
    # whole block_m x block_n tile of its own, the two taking the block's tiles in turn, so
    # one drains its accumulators while the other multiplies (CUTLASS's "ping-pong" schedule);
    # the cooperative default splits one tile's rows between them, and both drain at once.
    pingpong: bool = False
    # cluster (fprop, stride-1 dgrad): blocks launched as thread-block clusters of this many (1
    # or 2), side by side along M with the same N tile: each block's copy engine reads
    # 1/cluster of the weights' tile and multicasts it to every block of the cluster, so the
    # weights cross from L2 once a cluster, not once a block.  A stage is freed once every
    # block's consumers have read it, since the next multicast writes it in all of them.
    cluster: int = 1
    # tma_store (fprop, stride-1 dgrad): each warp converts its drained strip (16 rows x
    # 16*DRAIN_G columns) to the output's dtype in shared memory of its own, and one lane hands
    # it to the copy engine, which writes the rows and columns inside the output, in place of a
    # 16-byte store per lane and run.
    tma_store: bool = False

    def __post_init__(self) -> None:
        for name in ("persistent", "pingpong", "tma_store"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"TmaWgmma.{name} must be a bool, got {getattr(self, name)!r}")
        if self.pingpong and not self.persistent:
            raise ValueError("TmaWgmma(pingpong=True) hands a persistent block's tiles to its warpgroups in "
                             "turn: it needs persistent=True")
        if as_int("TmaWgmma.cluster", self.cluster) not in (1, 2):
            raise ValueError(f"TmaWgmma.cluster must be 1 or 2 blocks, got {self.cluster}")

    @property
    def tag(self) -> str:
        return ("tmapp" if self.pingpong else "tmap" if self.persistent else "tma") + \
            (f"c{self.cluster}" if self.cluster > 1 else "") + ("st" if self.tma_store else "")

    def check(self, plan: "Plan") -> None:
        if self.pingpong:
            # a warpgroup's accumulators: 2 x (block_n / 16) fragments of 8 fp32, at most 128
            if plan.warps_n != 1 or plan.warps_m != 8 or plan.block_m != 128 or plan.block_n > 128:
                raise ValueError(f"TmaWgmma(pingpong=True) runs two consumer warpgroups (plan.warps_m = 8, "
                                 f"warps_n = 1), each with a whole 128 x block_n tile of at most 128 "
                                 f"accumulators a thread: block_m = 128 and block_n <= 128, got "
                                 f"{plan.block_m}x{plan.block_n} and {plan.warps_m}x{plan.warps_n} warps")
        elif plan.warps_n != 1 or plan.warps_m not in (4, 8) or plan.block_m != 16 * plan.warps_m:
            raise ValueError(f"TmaWgmma needs one or two consumer warpgroups of 64 rows each: plan.warps_m in "
                             f"(4, 8), plan.warps_n = 1 and plan.block_m = 16 * warps_m, got block_m="
                             f"{plan.block_m} and {plan.warps_m}x{plan.warps_n} warps")
        if plan.block_k != TMA_BLOCK_K:
            raise ValueError(f"TmaWgmma stages 64 channels per step (one 128-byte swizzle row): plan.block_k "
                             f"must be {TMA_BLOCK_K}, got {plan.block_k}")
        if plan.block_n % 16 or not 16 <= plan.block_n <= 256:
            raise ValueError(f"TmaWgmma's wgmma is m64nNk16 with N a multiple of 16 up to 256: got plan.block_n="
                             f"{plan.block_n}")
        if self.persistent and plan.split_k != 1:
            raise ValueError(f"TmaWgmma(persistent=True) deals out the tiles (fprop, dgrad) or their K-steps (wgrad's "
                             f"stream-K) itself: plan.split_k must be 1, got {plan.split_k}")

    def flags(self) -> Flags:
        return Flags(tma=True, persistent=self.persistent, pingpong=self.pingpong, cluster=self.cluster,
                     tma_store=self.tma_store)

    def layout(self) -> str:
        return " " + self.tag

    def describe(self, plan: "Plan") -> str:
        return (f", TMA + wgmma: a producer warpgroup and {plan.warps_m // 4} consumer warpgroup(s)"
                + (", persistent" if self.persistent else "")
                + (", ping-pong (a tile per warpgroup, in turn)" if self.pingpong else "")
                + (f", clusters of {self.cluster} blocks sharing the weights' tile (TMA multicast)"
                   if self.cluster > 1 else "")
                + (", output stored by the copy engine (TMA)" if self.tma_store else ""))


# A TmaHalo tile is 128 positions: 128 / pitch rows on a grid of `pitch` columns.  The pitches
# the probe measured (pitch 32: 4 rows of 30 outputs; 64: 2 of 62; 128: 1 of 126).
TMA_HALO_PITCHES = (32, 64, 128)


@dataclass(frozen=True)
class TmaHalo(MainLoop):
    """Hopper's halo-reusing loop (sm_90a) for 3x3, stride-1, padding-1 layers that reduce 64
    channels into a multiple of 64 (fprop, and dgrad, which is the same convolution of dy by
    the filter flipped and transposed; convgen/tma_halo.py says where it runs).  A tile is TH = 128 / pitch output rows of one image
    laid on a grid of ``pitch`` columns, of which pitch - 2 are outputs; its input halo is
    one tiled TMA box (64 channels x pitch columns x TH + 2 rows), the copy engine writing
    zeros outside the image (the padding).  Position m reads tap (r, s) at halo row
    m + r * pitch + s, so a tap's A operand is the halo started that many 128-byte rows in
    and no pixel is copied once per tap as the im2col loop copies it.  The nine taps'
    weights of one 64-channel output slice (72 KB) are copied once per block, blocks are
    persistent (a slice each, where there are several), and ``plan.stages``
    halos stream through a ring from one producer thread to two consumer warpgroups of 64
    positions each (benchmarks/probes/tma_halo_loop_probe.py measured the loop)."""

    producer_warps: ClassVar[int] = 4
    pitch: int = 64

    def __post_init__(self) -> None:
        v = as_int("TmaHalo.pitch", self.pitch)
        if v not in TMA_HALO_PITCHES:
            raise ValueError(f"TmaHalo.pitch must be one of {TMA_HALO_PITCHES} (a tile is 128 positions, "
                             f"128 / pitch rows of it), got {v}")
        object.__setattr__(self, "pitch", v)

    @property
    def tag(self) -> str:
        return f"tmahalo{self.pitch}"

    def check(self, plan: "Plan") -> None:
        got = (plan.block_m, plan.block_n, plan.block_k, plan.warps_m, plan.warps_n, plan.split_k)
        if got != (128, 64, TMA_BLOCK_K, 8, 1, 1):
            raise ValueError(f"TmaHalo computes 128 positions x 64 filters a tile, 64 channels a tap, on two "
                             f"consumer warpgroups, whole reductions: block 128x64x64, warps 8x1, split_k 1; got "
                             f"block {plan.block_m}x{plan.block_n}x{plan.block_k}, warps {plan.warps_m}x"
                             f"{plan.warps_n}, split_k {plan.split_k}")
        if plan.stages > 4:
            raise ValueError(f"TmaHalo's stages are its ring of halo boxes, 2 to 4 (every ring measured the same), "
                             f"got {plan.stages}")

    def flags(self) -> Flags:
        return Flags(tma=True, halo_pitch=self.pitch)

    def layout(self) -> str:
        return " " + self.tag

    def describe(self, plan: "Plan") -> str:
        return (f", TMA halo tile of {128 // self.pitch}x{self.pitch - 2} outputs on pitch {self.pitch}, "
                f"a ring of {plan.stages} halos, weights resident, persistent")


def _tiles_suffix(tiles: int) -> str:
    return f"x{tiles}" if tiles > 1 else ""


def _check_tile(kind: MainLoop, plan: "Plan", tile_w: int, tiles: int) -> None:
    name = type(kind).__name__
    if plan.block_m % tile_w:
        raise ValueError(f"{name}.tile_w={tile_w} does not divide plan.block_m={plan.block_m}: a block computes a "
                         "(block_m / tile_w) x tile_w tile of output pixels")
    if tiles > 1 and plan.split_k > 1:
        raise ValueError(f"{name}.tiles={tiles} needs plan.split_k = 1, got {plan.split_k}: a block that computes "
                         "several tiles in turn owns their whole reductions")


def _tile_text(plan: "Plan", tile_w: int, tiles: int) -> str:
    return (f", halo tile {plan.block_m // tile_w}x{tile_w} pixels"
            + (f", {tiles} tiles per block" if tiles > 1 else ""))


@dataclass(frozen=True)
class _TileHalo(MainLoop):
    """What the two 2-D tiles that read each tap in place share (HaloTile, HaloLdsm): a plan of
    (block_m / tile_w) x tile_w pixels, ``tiles`` of them a block in turn; each subclass
    declares both fields."""

    def check(self, plan: "Plan") -> None:
        _check_tile(self, plan, self.tile_w, self.tiles)

    def flags(self) -> Flags:
        return Flags(tile_w=self.tile_w, tiles=self.tiles)

    def layout(self) -> str:
        return f" halo{self.tile_w}" + _tiles_suffix(self.tiles)

    def describe(self, plan: "Plan") -> str:
        return _tile_text(plan, self.tile_w, self.tiles)


@dataclass(frozen=True)
class HaloTile(_TileHalo):
    """A (block_m / tile_w) x tile_w tile of one image's output pixels; the input pixels its
    taps reach are staged once per K-step (BK channels, stride 1, channels in 16-byte runs)
    and each tap's WMMA fragments read in place.  tiles > 1 (a one-step reduction) has a
    block compute that many tiles in turn, staging every tap's weights once and the next
    tile's halo while it computes and drains the current one."""

    halo: ClassVar[bool] = True
    tile_w: int = 16
    tiles: int = 1

    def __post_init__(self) -> None:
        tw = as_int("HaloTile.tile_w", self.tile_w)
        if tw < FRAG or tw % FRAG:
            raise ValueError(f"HaloTile.tile_w={tw} must be a positive multiple of 16: a WMMA fragment's rows are 16 "
                             "neighbouring pixels of one tile row (8-pixel tiles are HaloLdsm)")
        object.__setattr__(self, "tile_w", tw)
        object.__setattr__(self, "tiles", _positive("HaloTile", "tiles", self.tiles))

    @property
    def tag(self) -> str:
        return f"halo{self.tile_w}" + _tiles_suffix(self.tiles)


@dataclass(frozen=True)
class HaloLdsm(_TileHalo):
    """A halo tile narrower than a fragment (8 pixels; any odd multiple of 8): a fragment's
    16 rows may span tile rows, so each lane gives ldmatrix its own row's address and the
    MMAs are raw mma.sync (CUDA only).  With tiles = 1, a tile at least as wide as the image
    and a whole number of images tall stacks that many images (footprint.halo_images), so a
    block of 8x8 images stages every tap's weights once per 128 or 256 pixels."""

    halo: ClassVar[bool] = True
    tile_w: int = 8
    tiles: int = 1

    def __post_init__(self) -> None:
        tw = as_int("HaloLdsm.tile_w", self.tile_w)
        if tw < 8 or tw % 8 or tw % FRAG == 0:
            raise ValueError(f"HaloLdsm.tile_w={tw} must be an odd multiple of 8 (8, 24, ...): a multiple of 16 "
                             "is a HaloTile, whose fragments each read one tile row")
        object.__setattr__(self, "tile_w", tw)
        object.__setattr__(self, "tiles", _positive("HaloLdsm", "tiles", self.tiles))

    @property
    def tag(self) -> str:
        return f"ldsm{self.tile_w}" + _tiles_suffix(self.tiles)


@dataclass(frozen=True)
class FlatHalo(MainLoop):
    """block_m consecutive positions of the batch's padded grid (footprint.flat_grid), a tap
    one fixed shift of them.  A 2-D tile's rows are whole fragments, so an image narrower
    than 16 pixels (an 8x8 CIFAR layer) wastes half of every 16-wide tile; the flat tile
    only spends MMAs on the grid's padding positions.  tiles as in :class:`HaloTile`."""

    halo: ClassVar[bool] = True
    tiles: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "tiles", _positive("FlatHalo", "tiles", self.tiles))

    @property
    def tag(self) -> str:
        return "flat" + _tiles_suffix(self.tiles)

    def check(self, plan: "Plan") -> None:
        if self.tiles > 1 and plan.split_k > 1:
            raise ValueError(f"FlatHalo.tiles={self.tiles} needs plan.split_k = 1, got {plan.split_k}: a block that "
                             "computes several tiles in turn owns their whole reductions")

    def flags(self) -> Flags:
        return Flags(flat=True, tiles=self.tiles)

    def layout(self) -> str:
        return " flat" + _tiles_suffix(self.tiles)

    def describe(self, plan: "Plan") -> str:
        return (f", flat halo tile of {plan.block_m} grid positions"
                + (f", {self.tiles} tiles per block" if self.tiles > 1 else ""))


@dataclass(frozen=True)
class StagedHalo(MainLoop):
    """fprop with C not a multiple of 8: a (block_m / tile_w) x tile_w pixel tile whose
    block stages its whole input halo, every channel, once, next to the pipeline; the
    im2col gather then reads that copy instead of global memory, so each input pixel
    leaves DRAM/L2 once instead of once per tap (any stride)."""

    halo: ClassVar[bool] = True
    tile_w: int = 16

    def __post_init__(self) -> None:
        tw = as_int("StagedHalo.tile_w", self.tile_w)
        if tw < FRAG or tw % FRAG:
            raise ValueError(f"StagedHalo.tile_w={tw} must be a positive multiple of 16: a WMMA fragment's rows are "
                             "16 neighbouring pixels of one tile row")
        object.__setattr__(self, "tile_w", tw)

    @property
    def tag(self) -> str:
        return f"staged{self.tile_w}"

    def check(self, plan: "Plan") -> None:
        _check_tile(self, plan, self.tile_w, 1)

    def flags(self) -> Flags:
        return Flags(tile_w=self.tile_w)

    def layout(self) -> str:
        return f" halo{self.tile_w}"

    def describe(self, plan: "Plan") -> str:
        return _tile_text(plan, self.tile_w, 1)


@dataclass(frozen=True)
class Depthwise(MainLoop):
    """A depthwise layer's stencil on the CUDA cores: no reduction over channels, so no MMA.
    fprop and dgrad: a block computes a (block_m / tile_w) x tile_w tile of output pixels of
    one image for block_n input channels (and their channel multiplier's outputs), from a halo
    staged once in shared memory; a thread owns ``cols`` neighbouring pixels of one tile row
    and vec_a channels, so each staged input column it reads serves every output of its run
    that the filter row reaches.  wgrad: a block sums dw and db for block_n channels over a
    slice of the batch's pixels (split_k slices), block_m pixels at a time, ``cols`` per
    thread (tile_w = block_m: a flat run); ``rows`` > 0 splits the filter's rows between
    threads, ``rows`` each (R / rows thread groups), so a large filter's sums stay in
    registers with 16-byte channel vectors.  ``tiles`` > 1 (fprop, dgrad) has a block compute
    that many neighbouring tiles in turn, copying the next one's halo while it computes the
    current one.  ``plan.stages`` is then the ring of halo buffers: 2 copies the next tile's
    halo while one is computed, 3 (with ``tiles`` of 3 or more) the next two.  ``out_rows`` > 1
    (fprop): a thread owns that many rows of runs and holds its channels' whole filter in
    registers, so each staged value is read once for every output and tap it feeds; (wgrad) a
    run spans that many dy rows, each staged x row read once for all of them.  ``mma``
    (fprop, stride 1): the stencil on the tensor cores, each filter row a banded Toeplitz
    matrix that 16 staged rows of one channel multiply (mma.sync m16n8k16), the halo staged
    channel-major; ``cols`` is then 8, the MMA's output columns.  block_k has no meaning
    here: it must be 16, and warps_n 1 (the thread count is warps_m warps)."""

    warp_grid: ClassVar[bool] = False
    tile_w: int = 16
    cols: int = 4
    rows: int = 0
    tiles: int = 1  # fprop, dgrad: pixel tiles a block computes in turn, the next one's halo copied meanwhile
    # fprop, dgrad: consecutive blocks take one tile group's channel chunks in turn (chunk first)
    # rather than one chunk's tile groups, so a pixel's chunks are read together and share the
    # DRAM granules they straddle in L2 (convgen/depthwise.py, whole_pixel_chunk).
    interleave: bool = False
    out_rows: int = 1  # fprop: output rows a thread computes, its filter in registers; wgrad: dy rows a run spans
    mma: bool = False  # fprop: the stencil on mma.sync, filter rows as banded Toeplitz matrices

    def __post_init__(self) -> None:
        if not isinstance(self.interleave, bool):
            raise TypeError(f"Depthwise.interleave must be a bool, got {self.interleave!r}")
        if not isinstance(self.mma, bool):
            raise TypeError(f"Depthwise.mma must be a bool, got {self.mma!r}")
        object.__setattr__(self, "out_rows", _positive("Depthwise", "out_rows", self.out_rows))
        object.__setattr__(self, "tile_w", _positive("Depthwise", "tile_w", self.tile_w))
        object.__setattr__(self, "cols", _positive("Depthwise", "cols", self.cols))
        rows = as_int("Depthwise.rows", self.rows)
        if rows < 0:
            raise ValueError(f"Depthwise.rows must be >= 0 (0: a thread sums every filter row), got {rows}")
        object.__setattr__(self, "rows", rows)
        object.__setattr__(self, "tiles", _positive("Depthwise", "tiles", self.tiles))
        if self.tile_w % self.cols:
            raise ValueError(f"Depthwise.cols={self.cols} must divide Depthwise.tile_w={self.tile_w}: a thread "
                             "owns cols neighbouring pixels of one tile row")

    @property
    def tag(self) -> str:
        return (f"dw{self.tile_w}c{self.cols}" + (f"r{self.rows}" if self.rows else "") + _tiles_suffix(self.tiles)
                + ("i" if self.interleave else "") + (f"o{self.out_rows}" if self.out_rows > 1 else "")
                + ("m" if self.mma else ""))

    def check(self, plan: "Plan") -> None:
        if (plan.block_k, plan.warps_n) != (FRAG, 1):
            raise ValueError(f"Depthwise has no K-steps or warp grid: plan.block_k = 16 and warps_n = 1, got "
                             f"{plan.block_k} and {plan.warps_n}")
        if plan.stages not in (2, 3) or (plan.stages == 3 and self.tiles < 3):
            raise ValueError(f"Depthwise's stages are its ring of halo buffers: 2, or 3 with Depthwise.tiles of 3 or "
                             f"more (the next two tiles copied while one is computed); got stages={plan.stages} with "
                             f"tiles={self.tiles}")
        if plan.block_m % self.tile_w:
            raise ValueError(f"Depthwise.tile_w={self.tile_w} does not divide plan.block_m={plan.block_m}: a block "
                             "computes a (block_m / tile_w) x tile_w tile of pixels")
        if plan.block_n % plan.vec_a:
            raise ValueError(f"plan.vec_a={plan.vec_a} does not divide plan.block_n={plan.block_n}: a thread owns "
                             "vec_a of the block's channels")
        if plan.block_m % self.cols:
            raise ValueError(f"Depthwise.cols={self.cols} does not divide plan.block_m={plan.block_m}")
        if plan.block_m // self.tile_w % self.out_rows:
            raise ValueError(f"Depthwise.out_rows={self.out_rows} does not divide the tile's "
                             f"{plan.block_m // self.tile_w} rows: a thread owns out_rows whole rows of runs")

    def flags(self) -> Flags:
        return Flags(tile_w=self.tile_w, tiles=self.tiles, depthwise=self.cols, dw_rows=self.rows,
                     dw_interleave=self.interleave, dw_out_rows=self.out_rows, dw_mma=self.mma)

    def layout(self) -> str:
        return " " + self.tag

    def headline(self, plan: "Plan") -> str:
        """No GEMM block, warp grid or pipeline: the stencil's tile, threads and reads."""
        return (f"depthwise stencil: {plan.block_m // self.tile_w}x{self.tile_w} pixels x {plan.block_n} channels a "
                f"block, {plan.warps} warps, {self.cols} pixel(s) x {plan.vec_a} channel(s) a thread"
                + (f", filter rows {self.rows} a thread" if self.rows else "")
                + (f", {self.tiles} tiles a block in turn" if self.tiles > 1 else "")
                + (", blocks chunk first" if self.interleave else "")
                + (f", {self.out_rows} rows of pixels a thread" if self.out_rows > 1 else "")
                + (", on mma.sync (banded Toeplitz filter rows)" if self.mma else "")
                + f", read {plan.read_a}" + (f", {plan.split_k} slices of the pixels" if plan.split_k > 1 else "")
                + (" summed in the kernel" if plan.split_reduce == "grid" else ""))


KINDS: tuple[type[MainLoop], ...] = (Im2col, Wgmma, TmaWgmma, TmaHalo, HaloTile, HaloLdsm, FlatHalo, StagedHalo, Depthwise)
