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
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence, Union

from ._valid import as_int as _int
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
