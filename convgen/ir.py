"""The shape IR: what a convolution is, independent of how it is computed.

Everything here is plain, frozen data with validation at construction, so a bad
value is rejected where the user typed it, with a message naming the field,
instead of surfacing later as a compile error or a wrong number.

Layouts are fixed: activations NHWC, weights KRSC.  The batch size N is *not*
part of what a kernel is specialised to (:class:`ConvGeometry`): it is a
run-time argument, so the last partial batch of an epoch never compiles again.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence, Union

from ._valid import as_int as _int
from .dtypes import check_dtypes, resolve_mma_dtype
from .mainloop import KINDS, Flags, Im2col, MainLoop, from_flags
from .targets import ARCHES, Arch

Pair = tuple[int, int]
PairLike = Union[int, Sequence[int]]
DType = Literal["float16", "bfloat16", "float32"]
DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32")  # which go together: convgen/dtypes.py


def as_pair(name: str, value: PairLike) -> Pair:
    """Accept ``3`` or ``(3, 3)`` (height, width), as PyTorch does."""
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise ValueError(f"{name} must be an int or a (height, width) pair, got {value!r}")
        return (_int(f"{name}[0]", value[0]), _int(f"{name}[1]", value[1]))
    v = _int(name, value)
    return (v, v)


class Pass(str, enum.Enum):
    """The three convolution passes, each an implicit GEMM (see :meth:`ConvGeometry.gemm`)."""

    FPROP = "fprop"  # y = conv(x, w) [+ bias]
    DGRAD = "dgrad"  # dx from dy and w
    WGRAD = "wgrad"  # dw (and db) from x and dy

    @classmethod
    def parse(cls, value: "Pass | str") -> "Pass":
        if isinstance(value, Pass):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            raise ValueError(
                f"pass must be one of {', '.join(p.value for p in cls)}, got {value!r}"
            ) from None


@dataclass(frozen=True)
class GemmShape:
    """The implicit-GEMM view of one pass: C[m, n] = sum_k A[m, k] * B[k, n]."""

    m: int
    n: int
    k: int
    m_axis: str
    n_axis: str
    k_axis: str

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k


@dataclass(frozen=True)
class ConvGeometry:
    """Every shape value of a conv2d except the batch size: what a kernel is built for.

    ``c`` is the input channel count, ``k`` the output channel count, ``r``/``s``
    the filter height/width.  ``stride``, ``padding`` and ``dilation`` are
    (height, width) pairs; an int means the same value on both axes.  ``groups`` splits
    the channels as ``torch.nn.functional.conv2d`` does: output channel k reads only the
    C/groups input channels of its group, and the weights are (K, R, S, C/groups);
    groups = C is a depthwise convolution (K = m*C gives each channel m filters).
    """

    h: int
    w: int
    c: int
    k: int
    r: int
    s: int
    stride: PairLike = (1, 1)
    padding: PairLike = (0, 0)
    dilation: PairLike = (1, 1)
    groups: int = 1

    def __post_init__(self) -> None:
        for name in ("h", "w", "c", "k", "r", "s", "groups"):
            v = _int(name, getattr(self, name))
            if v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
            object.__setattr__(self, name, v)
        for name, low, hint in (
            ("stride", 1, "use 1 for a dense convolution"),
            ("dilation", 1, "use 1 for an undilated filter"),
            ("padding", 0, "padding cannot be negative; crop the input instead"),
        ):
            pair = as_pair(name, getattr(self, name))
            for axis, v in zip(("height", "width"), pair):
                if v < low:
                    raise ValueError(f"{name} ({axis}) must be >= {low}, got {v}: {hint}")
            object.__setattr__(self, name, pair)
        for name in ("c", "k"):
            if getattr(self, name) % self.groups:
                raise ValueError(f"groups={self.groups} must divide {name}={getattr(self, name)}: each group "
                                 f"has {name}/groups {'input' if name == 'c' else 'output'} channels")
        for axis, out, size, pad, eff in (
            ("height", "p", self.h, self.padding[0], self.effective_r),
            ("width", "q", self.w, self.padding[1], self.effective_s),
        ):
            if size + 2 * pad < eff:
                raise ValueError(
                    f"output {axis} {out} would be <= 0: the padded input {axis} "
                    f"{size} + 2*{pad} = {size + 2 * pad} is smaller than the dilated "
                    f"filter {axis} {eff}; pad more, or use a smaller filter or dilation"
                )

    # -- derived sizes -------------------------------------------------------
    @property
    def effective_r(self) -> int:
        return self.dilation[0] * (self.r - 1) + 1

    @property
    def effective_s(self) -> int:
        return self.dilation[1] * (self.s - 1) + 1

    @property
    def cg(self) -> int:
        """Input channels per group (C for an ungrouped convolution, 1 for depthwise)."""
        return self.c // self.groups

    @property
    def kg(self) -> int:
        """Output channels per group (the channel multiplier of a depthwise convolution)."""
        return self.k // self.groups

    @property
    def depthwise(self) -> bool:
        """Each input channel convolved on its own: groups = C (K = m*C, m filters each)."""
        return self.groups > 1 and self.groups == self.c

    @property
    def p(self) -> int:
        return (self.h + 2 * self.padding[0] - self.effective_r) // self.stride[0] + 1

    @property
    def q(self) -> int:
        return (self.w + 2 * self.padding[1] - self.effective_s) // self.stride[1] + 1

    def gemm(self, pass_: Pass | str, n: int) -> GemmShape:
        """The implicit GEMM of ``pass_`` for batch ``n``.

        wgrad is laid out as M = K (output channels), N = R*S*C, reduction over
        the N*P*Q output pixels: dy^T is then read through a col-major A fragment
        straight from dy's NHWC rows, the gathered x tile stays channel-contiguous
        (16-byte loads), and dw comes out row-major in KRSC order with no transpose.
        A grouped convolution is ``groups`` such GEMMs side by side, each reducing over one
        group's channels: the reduction (fprop, dgrad) or wgrad's N counts one group's, so
        ``flops`` stays the work done.
        """
        p = Pass.parse(pass_)
        rs = self.r * self.s
        g = "/G" if self.groups > 1 else ""
        if p is Pass.FPROP:
            return GemmShape(n * self.p * self.q, self.k, rs * self.cg, "N*P*Q", "K", f"R*S*C{g}")
        if p is Pass.DGRAD:
            return GemmShape(n * self.h * self.w, self.c, rs * self.kg, "N*H*W", "C", f"R*S*K{g}")
        return GemmShape(self.k, rs * self.cg, n * self.p * self.q, "K", f"R*S*C{g}", "N*P*Q")

    def group_gemm(self, pass_: Pass | str, n: int) -> GemmShape:
        """One group's GEMM: what a GEMM kernel's block tiles.  ``groups`` of them side by
        side fill :meth:`gemm`'s output (its channel axis is every group's); for an
        ungrouped layer the two are the same."""
        full = self.gemm(pass_, n)
        if self.groups == 1:
            return full
        p = Pass.parse(pass_)
        if p is Pass.WGRAD:
            return GemmShape(self.kg, full.n, full.k, "K/G", full.n_axis, full.k_axis)
        return GemmShape(full.m, full.n // self.groups, full.k, full.m_axis, f"{full.n_axis}/G", full.k_axis)

    def describe(self) -> str:
        sh, sw = self.stride
        ph, pw = self.padding
        dh, dw = self.dilation
        return (
            f"{self.h}x{self.w} {self.c}->{self.k} {self.r}x{self.s} "
            f"stride {sh},{sw} pad {ph},{pw} dil {dh},{dw}" + (f" groups {self.groups}" if self.groups > 1 else "")
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "h": self.h, "w": self.w, "c": self.c, "k": self.k, "r": self.r, "s": self.s,
            "stride": list(self.stride), "padding": list(self.padding),
            "dilation": list(self.dilation),
            # only where grouped, so every ungrouped kernel keeps its key, name and cache entries
            **({"groups": self.groups} if self.groups > 1 else {}),
        }


@dataclass(frozen=True)
class ConvProblem(ConvGeometry):
    """A geometry plus a batch size: one concrete convolution.

    ``n`` is keyword-only: ``ConvProblem(n=256, h=32, w=32, c=3, k=16, r=3, s=3, padding=1)``.
    N = 0 (an empty batch) is valid.
    """

    n: int = field(default=1, kw_only=True)

    def __post_init__(self) -> None:
        n = _int("n", self.n)
        if n < 0:
            raise ValueError(f"n (batch size) must be >= 0, got {n}")
        object.__setattr__(self, "n", n)
        super().__post_init__()

    @classmethod
    def create(
        cls,
        n: int, h: int, w: int, c: int, k: int, r: int, s: int,
        stride: PairLike = 1,
        padding: PairLike | str = 0,
        dilation: PairLike = 1,
        groups: int = 1,
    ) -> "ConvProblem":
        """Like the constructor, but ``padding`` may also be ``'same'`` or ``'valid'``."""
        pad = resolve_padding(padding, r, s, stride, dilation)
        return cls(h, w, c, k, r, s, stride, pad, dilation, groups, n=n)

    @property
    def geometry(self) -> ConvGeometry:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(ConvGeometry)}
        return ConvGeometry(**fields)

    def gemm(self, pass_: Pass | str, n: int | None = None) -> GemmShape:  # type: ignore[override]
        return super().gemm(pass_, self.n if n is None else n)

    def group_gemm(self, pass_: Pass | str, n: int | None = None) -> GemmShape:  # type: ignore[override]
        return super().group_gemm(pass_, self.n if n is None else n)

    def flops(self, pass_: Pass | str) -> int:
        return self.gemm(pass_).flops

    @property
    def x_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.h, self.w, self.c)

    @property
    def w_shape(self) -> tuple[int, int, int, int]:
        return (self.k, self.r, self.s, self.cg)

    @property
    def y_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.p, self.q, self.k)

    def with_batch(self, n: int) -> "ConvProblem":
        return dataclasses.replace(self, n=n)

    def describe(self) -> str:
        return f"N={self.n} " + super().describe()

    def as_dict(self) -> dict[str, Any]:
        return {"n": self.n, **super().as_dict()}


def resolve_padding(
    padding: PairLike | str, r: int, s: int, stride: PairLike = 1, dilation: PairLike = 1
) -> Pair:
    """Turn ``'same'``/``'valid'`` into explicit (height, width) padding.

    'same' follows PyTorch: output size equals input size, so it needs stride 1
    and an odd dilated filter (symmetric padding); anything else is rejected
    rather than padded asymmetrically behind the caller's back.
    """
    if isinstance(padding, str):
        mode = padding.lower()
        if mode == "valid":
            return (0, 0)
        if mode != "same":
            raise ValueError(f"padding must be an int, a pair, 'same' or 'valid', got {padding!r}")
        if as_pair("stride", stride) != (1, 1):
            raise ValueError(f"padding='same' needs stride 1, got stride {stride!r}; give explicit padding")
        dil = as_pair("dilation", dilation)
        pads = []
        for axis, size, d in (("height", r, dil[0]), ("width", s, dil[1])):
            total = d * (size - 1)
            if total % 2:
                raise ValueError(
                    f"padding='same' with an even dilated filter {axis} ({total + 1}) needs "
                    "asymmetric padding, which convgen does not do; give explicit padding"
                )
            pads.append(total // 2)
        return (pads[0], pads[1])
    return as_pair("padding", padding)


@dataclass(frozen=True)
class Epilogue:
    """What happens to the accumulator before it is stored.

    ``bias``: fprop adds a per-output-channel bias; wgrad also returns db.
    ``relu``: fprop only.  ``out_dtype``: float16 (the default, for speed), bfloat16 or float32.
    ``bias_dtype``: what fprop's epilogue reads the bias as, float32 or float16 (bfloat16): a float16
    model's bias goes in as it is, with no cast kernel launched before each forward.
    ``residual`` (fprop): y = act(alpha * conv + bias + beta * residual), a tensor of y's
    shape and dtype read in the epilogue, so a ResNet block's skip connection costs no
    extra pass over y; alpha and beta are the kernel's run-time arguments.  ``gelu``
    (fprop): GELU (the erf form, PyTorch's default) instead of ReLU.
    """

    bias: bool = False
    relu: bool = False
    out_dtype: DType = "float16"
    bias_dtype: DType = "float32"
    residual: bool = False
    gelu: bool = False

    def __post_init__(self) -> None:
        if self.relu and self.gelu:
            raise ValueError("epilogue relu and gelu are two activations; choose one")
        for name in ("bias", "relu", "residual", "gelu"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"epilogue {name} must be True or False, got {getattr(self, name)!r}")
        if self.out_dtype not in DTYPES:
            raise ValueError(f"out_dtype must be one of {DTYPES}, got {self.out_dtype!r}")
        if self.bias_dtype not in DTYPES:
            raise ValueError(f"bias_dtype must be one of {DTYPES}, got {self.bias_dtype!r}")

    def as_dict(self) -> dict[str, Any]:
        """The fields a kernel's key hashes.  ``bias_dtype`` only where it is not float32 (the
        dtype every kernel read before the field existed), so those kernels keep their keys,
        names and cache entries."""
        d = dataclasses.asdict(self)
        if d["bias_dtype"] == "float32":
            del d["bias_dtype"]
        for name in ("residual", "gelu"):  # likewise, only where set
            if not d[name]:
                del d[name]
        return d

    def check_pass(self, pass_: Pass) -> None:
        for name in ("relu", "gelu", "residual"):
            if getattr(self, name) and pass_ is not Pass.FPROP:
                raise ValueError(f"{name} is an fprop epilogue; {pass_.value} cannot apply it")
        if self.bias and pass_ is Pass.DGRAD:
            raise ValueError("bias does not apply to dgrad (dx does not depend on the bias)")
        if self.bias_dtype != "float32" and not (self.bias and pass_ is Pass.FPROP):
            raise ValueError(f"bias_dtype is what fprop's bias is read as; {pass_.value} "
                             f"{'with' if self.bias else 'without'} a bias reads none")


@dataclass(frozen=True)
class Target:
    """Where a kernel runs.  Built from an arch name; the SM count comes from the live
    device when there is one (see ``convgen.compile.detect_target``).  What the arch can
    do is ``target.info`` (:class:`convgen.targets.Arch`)."""

    arch: str = "sm_90"
    sm_count: int | None = None

    def __post_init__(self) -> None:
        if self.arch not in ARCHES:
            raise ValueError(f"unknown arch {self.arch!r}; known: {', '.join(ARCHES)}")
        if self.sm_count is None:
            object.__setattr__(self, "sm_count", ARCHES[self.arch].default_sm_count)
        count = _int("sm_count", self.sm_count)
        if count < 1:
            raise ValueError(f"sm_count must be >= 1, got {count}")
        object.__setattr__(self, "sm_count", count)

    @property
    def info(self) -> Arch:
        return ARCHES[self.arch]

    @property
    def backend(self) -> str:
        return self.info.backend

    @property
    def warp_size(self) -> int:
        return self.info.warp_size

    @property
    def smem_limit(self) -> int:
        return self.info.smem_limit

    def as_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "arch": self.arch, "sm_count": self.sm_count}


def stages_whole_halo(geometry: "ConvGeometry", pass_: "Pass | str") -> bool:
    """Whether a 2-D halo tile of this layer is a :class:`StagedHalo`: fprop with C not a
    multiple of 8 (a 3-channel first layer), whose channels cannot be read in 16-byte runs."""
    return Pass.parse(pass_) is Pass.FPROP and geometry.c % 8 != 0


_PLAN_INTS = ("block_m", "block_n", "block_k", "warps_m", "warps_n", "stages", "vec_a", "vec_b", "split_k")


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
    reasons: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        for name in _PLAN_INTS:
            v = _int(name, getattr(self, name))
            if v < 1:
                raise ValueError(f"plan.{name} must be >= 1, got {v}")
            object.__setattr__(self, name, v)
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v % 16:
                raise ValueError(f"plan.{name} must be a multiple of 16 (the fragment size), got {v}")
        grid = getattr(self.loop, "warp_grid", True)  # a bad loop is refused below, with its own message
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
        common = {k: v for k, v in d.items() if k not in Flags._fields}
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
        """Emitter's view: whether the kind is :class:`~convgen.mainloop.TmaWgmma`."""
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
        return d

    def layout(self) -> str:
        """The halo tile in a table cell: " halo16", " flat", "x2" for two tiles per block,
        and " wgmma"; empty for a WMMA im2col plan."""
        return self.loop.layout()

    def brief(self) -> str:
        """One table cell: tile, warps, stages, split-K, and the halo tile if any."""
        return (f"{self.block_m}x{self.block_n}x{self.block_k} w{self.warps_m}x{self.warps_n}"
                + (f"x{self.warps_k}" if self.warps_k > 1 else "") + f" s{self.stages} k{self.split_k}" + self.layout())

    def explain(self) -> str:
        head = (
            f"block {self.block_m}x{self.block_n}x{self.block_k}, {self.warps} warps "
            f"({self.warps_m}x{self.warps_n}" + (f"x{self.warps_k}, K sliced {self.warps_k} ways" if self.warps_k > 1 else "")
            + f", warp tile {self.warp_tile[0]}x{self.warp_tile[1]}), "
            f"{self.stages} stages, vec A/B {self.vec_a}/{self.vec_b}, read A/B {self.read_a}/{self.read_b}, "
            f"split-K {self.split_k}" + self.loop.describe(self)
        )
        return "\n".join([head, *(f"  - {r}" for r in self.reasons)])


# A plan dict's keys, in as_dict's order: the shared fields, then the kind's flags.
PLAN_KEYS: tuple[str, ...] = ("block_m", "block_n", "block_k", "warps_m", "warps_n", "stages", "vec_a", "vec_b",
                              "read_a", "read_b", "split_k", *Flags._fields)


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

    def __post_init__(self) -> None:
        if isinstance(self.geometry, ConvProblem):  # drop the batch: it is a run-time argument
            object.__setattr__(self, "geometry", self.geometry.geometry)
        object.__setattr__(self, "pass_", Pass.parse(self.pass_))
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
        The key's first 8 hex digits keep apart specs that share all of those (epilogue,
        dtypes, warps, gather widths, split-K)."""
        g, p = self.geometry, self.plan
        return (
            f"convgen_{self.pass_.value}_{p.loop.tag}_{p.block_m}x{p.block_n}x{p.block_k}_s{p.stages}"
            f"_{self.target.arch.replace('_', '')}"
            f"_{g.h}x{g.w}_c{g.c}_k{g.k}_{g.r}x{g.s}"
            f"_s{g.stride[0]}{g.stride[1]}_p{g.padding[0]}{g.padding[1]}"
            f"_d{g.dilation[0]}{g.dilation[1]}" + (f"_g{g.groups}" if g.groups > 1 else "") + f"_{self.key[:8]}"
        )
