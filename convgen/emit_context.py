"""The emission context: every fact a kernel template reads, computed once, each in one place.

Frozen dataclasses, so a template cannot change what another reads, and a fact has one name
wherever the templates use it.  convgen/emit.py computes them from a :class:`KernelSpec`
(``_context``) and renders; this module only says what they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import stream_k
from .depthwise import DwFacts
from .residues import ResidueClass
from .targets import Arch


@dataclass(frozen=True)
class Shape:
    """The convolution's compile-time shape (every value but the batch)."""

    h: int
    w: int
    c: int
    k: int
    r: int
    s: int
    p: int
    q: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int
    # A grouped layer on a GEMM loop is `groups` GEMMs side by side: c and k above are then
    # one group's channels, and c_pix, k_pix a pixel's in x and y (every group's).
    groups: int = 1
    c_pix: int = 0
    k_pix: int = 0
    pack: int = 1  # wgrad: groups of the user's layer a slab (KernelSpec.pack, parts/packed_dw.j2)


@dataclass(frozen=True)
class Tile:
    """The block's GEMM tile, its warps and its shared-memory pipeline."""

    block_m: int
    block_n: int
    block_k: int
    warps_m: int
    warps_n: int
    warps_k: int  # > 1: sliced K (im2col WMMA only)
    stages: int
    ring: int  # stages allocated: footprint.ring_stages
    persistent: bool  # a TMA block walks tiles until none are left (TmaWgmma.persistent)
    pingpong: bool  # and its two consumer warpgroups take those tiles in turn (TmaWgmma.pingpong)
    cluster: int  # blocks a thread-block cluster, which share the weights' tile (TmaWgmma.cluster)
    store_bytes: int  # a warp's shared memory for the copy engine's stores of the output (TmaWgmma.tma_store); 0: none
    pad: int  # halves of padding per staged row
    a_col: bool  # A staged [BK][BM] (wgrad's dy^T) rather than [BM][BK]
    b_col: bool  # B staged [BN][BK] (fprop's w) rather than [BK][BN]


@dataclass(frozen=True)
class Gathers:
    """What the operand gathers read and how they move it."""

    ta: str  # C type read for A
    tb: str
    vec_a: int
    vec_b: int
    async_a: bool  # cp.async moves 4, 8 or 16 bytes of fp16; scalar and fp32 gathers go through registers
    async_b: bool
    rowmap_a: bool  # the im2col-like operand's scalar gather owns whole rows (RowMap)
    rowmap_b: bool


@dataclass(frozen=True)
class Halo:
    """A halo kind's pixel tile and its staged halo."""

    ld: int  # halves per staged halo pixel of a 16-channel slab
    tile: tuple[int, int, int, int]  # (tile rows, tile columns, halo rows, halo columns); zeros for a flat tile
    imgs: int  # whole images stacked in one 8-wide tile (footprint.halo_images), else 1
    flat_grid: tuple[int, int]  # a flat tile's grid (rows, columns per image); zeros otherwise
    pix: int  # pixels of one staged halo (the "taps" kinds)
    flip: bool  # the taps walk the halo flipped (dgrad reads dy at h + PH - r*DH)
    staged_halves: int  # the staged-halo kind's whole input halo, in halves; 0 otherwise
    tiles: int  # pixel tiles one block computes in turn


@dataclass(frozen=True)
class HaloBox:
    """The TMA halo kind's tile (convgen/tma_halo.py): TH x TW outputs on a grid of PITCH
    columns, its halo one TMA box of (TH + 2) rows, and the image's tiles."""

    pitch: int
    rows: int  # TH: output rows a tile
    cols: int  # TW = PITCH - 2: output columns a tile
    box_bytes: int
    tail_bytes: int  # past each box in the ring (footprint.TMA_HALO_TAIL_BYTES)
    barrier_bytes: int  # the mbarriers' room, ahead of the weights (footprint.TMA_HALO_BARRIER_BYTES)
    weight_bytes: int
    tiles_h: int  # tiles down an image
    tiles_w: int  # and across it
    slices: int  # 64-channel slices of the output: a block holds one slice's weights (tma_halo.slices)
    flip: bool  # dgrad: tap (r, s) multiplies the weights of tap (R-1-r, S-1-s), read transposed


@dataclass(frozen=True)
class Epilogue:
    out_t: str
    bias_add: bool  # fprop adds the bias
    bias_t: str  # what it reads the bias as
    relu: bool
    gelu: bool  # fprop's activation is GELU (erf form)
    residual: bool  # fprop reads a residual of y's shape: v = alpha * v + beta * residual, before the bias
    db: bool  # wgrad sums db
    drain_group: int  # fragments drained side by side (footprint.drain_group)
    pad: int  # floats of padding per scratch row


@dataclass(frozen=True)
class Elem:
    """The kernel's 16-bit element type (the templates' ``half_t``) and how it is spelled: the
    fp16 spellings are the ones every kernel had before bf16, so fp16 kernels stay byte-identical."""

    bf16: bool
    c_type: str  # what half_t is
    frag: str  # the fragments' element type (frag_half_t)
    ptx: str  # the operand type of mma.sync and wgmma: "f16" or "bf16"
    to_float: str  # a function (or cast) from half_t to float
    from_float: str  # and from float to half_t
    include: str  # a header the bf16 type needs beyond the backend's ("" for fp16)


def elem_type(mma_dtype: str, be: Arch) -> Elem:
    if mma_dtype == "bfloat16":
        return Elem(bf16=True, c_type=be.bf16_type, frag=be.frag_bf16, ptx="bf16", to_float="static_cast<float>",
                    from_float="static_cast<half_t>", include=be.bf16_include)
    return Elem(bf16=False, c_type="__half", frag=be.frag_half, ptx="f16", to_float="__half2float",
                from_float="__float2half", include="")


@dataclass(frozen=True)
class SplitK:
    """The split-K reduction's layout: a kernel of its own, or (``in_kernel``, plan
    split_reduce "grid") the main kernel's last phase, its first ``rows`` warps summing."""

    slices: int
    reduce_name: str
    rows: int
    ways: int
    vec: int
    db_vec: int
    out_n: int  # a row of the output, and of each slice: every group's columns
    in_kernel: bool = False


# The main-loop kinds (`_kind`), and the MMA flavours they compute with.
KINDS = ("im2col", "im2col_wgmma", "tma", "tma_halo", "halo", "halo_ldsm", "halo_flat", "staged_halo", "depthwise")
MMAS = ("wmma", "ldsm", "wgmma", "none")


@dataclass(frozen=True)
class Context:
    """Everything a kernel template reads.  ``kind`` names the main loop; ``mma`` the MMA
    flavour it computes with ("wmma", "ldsm": ldmatrix + mma.sync, "wgmma")."""

    name: str
    pass_: str
    kind: str
    mma: str
    banner: tuple[str, ...]  # the header comment's lines
    be: Arch
    elem: Elem
    shape: Shape
    tile: Tile
    gathers: Gathers
    halo: Halo | None
    epi: Epilogue
    split: SplitK | None
    gemm_n: int
    gemm_n_axis: str
    smem_bytes: int
    wgmma_regs: int  # wgmma: accumulator registers per m64 step (BN / 2)
    classes: tuple[ResidueClass, ...] = ()  # the TMA dgrad's stride residue classes, in launch order
    dw: DwFacts | None = None  # the depthwise kind's tile and threads (convgen/depthwise.py)
    box: HaloBox | None = None  # the TMA halo kind's tile and box
    streamk: stream_k.StreamK | None = None  # wgrad's stream-K blocks and reduction (convgen/stream_k.py)

    def __post_init__(self) -> None:
        if self.kind not in KINDS or self.mma not in MMAS:
            raise ValueError(f"unknown main-loop kind {self.kind!r} or MMA flavour {self.mma!r}")
        if (self.halo is None) != (self.kind in ("im2col", "im2col_wgmma", "tma", "tma_halo", "depthwise")):
            raise ValueError(f"kind {self.kind!r} with halo facts {self.halo!r}")

    @property
    def taps(self) -> bool:
        """The halo kinds that stage BK channels of the halo per step and read each tap's
        fragments in place (the staged-halo kind runs the im2col gather on its copy instead)."""
        return self.kind in ("halo", "halo_ldsm", "halo_flat")

    @property
    def loop(self) -> str:
        """The kernel body's structure, which picks its template: "im2col" (from global
        memory), "tma" (Hopper's copy engine and warpgroups), "tma_halo" (the same, one halo
        box a tile), "staged_halo", "depthwise" (a CUDA-core stencil), "halo" (the taps
        read in place) or "halo_tiles" (several pixel tiles per block)."""
        if self.kind in ("im2col", "im2col_wgmma", "tma", "tma_halo", "staged_halo", "depthwise"):
            return self.kind.replace("_wgmma", "")
        return "halo_tiles" if self.halo is not None and self.halo.tiles > 1 else "halo"

    @property
    def template(self) -> str:
        if self.kind == "tma_halo":  # one kernel for both passes: a stride-1 dgrad is the same convolution
            return "kernels/tma_halo.j2"
        if self.dw is not None and self.dw.out_rows > 1 and self.pass_ == "fprop":  # its filter held in registers
            return f"kernels/{self.pass_}_depthwise_held.j2"
        if self.dw is not None and self.dw.mma:  # the stencil on mma.sync
            return f"kernels/{self.pass_}_depthwise_mma.j2"
        return f"kernels/{self.pass_}_{self.loop}.j2"
