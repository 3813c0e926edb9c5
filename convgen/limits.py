"""The generated kernels' 32-bit limits, checked where a spec is made and at launch.

The templates hold every shape value in a C++ ``int`` and compute per-image and
per-row quantities in ``int``: an image's pixel index (H*W, P*Q), a weight row
(R*S*C), the reduction's K-step count, a tile's row and column.  What can exceed
2^31 in a real tensor is 64-bit (``long long``): an image's offset (n*H*W*C), a
pixel's element offset, the output row m of N*P*Q, the split-K workspace.  So a
tensor may be far past 2^31 elements (tests/test_kernels_gpu.py runs one), but a
shape whose ``int`` quantities would wrap is rejected here, naming the value and
the limit, instead of being compiled into a kernel that reads the wrong memory.

The quantities, and where the templates use them (templates/*.j2):

* every shape value: ``constexpr int H, W, C, K, R, S, P, Q, SH, ...``;
* the padded input extents h + 2*pad, and stride and dilation: a gather's row
  index runs from -pad to h + pad (``o.ih0 + r*DH``, dgrad's ``o.p0 - dp``), a row
  past the tile is marked -2^30, which must stay out of range after a tap's offset
  is added, and dgrad's residue classes add a stride to a padding (``mod_``);
* the padded image's pixel count (h + 2*pad_h) * (w + 2*pad_w): bounds P*Q and H*W
  (``pq``, ``udiv<P * Q>``, dgrad's residue classes) and dgrad's tap offset
  ``dp * Q + dq``; dgrad's tap step lcm(stride, dilation);
* R*S*C (fprop's and wgrad's reduction and weight row, ``RSC``) and R*S*K (dgrad's
  reduction, ``Cls::RED``), plus a tile of headroom (``kk = kt*BK + col``);
* with a plan: the grid's y extent (output-column tiles, at most 65535), dgrad's
  weight step ``Map::row(i) * (R*S*C)``, wgrad's db workspace index ``z*K + m``;
* with a batch: the ``int batch`` argument, wgrad's K-step count over N*P*Q
  pixels (``k_range``), and the launch's grid x extent.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .ir import ConvGeometry, ConvProblem, Pass
from .spec import Plan

if TYPE_CHECKING:  # pragma: no cover
    from .emit import KernelSource

INT_MAX = 2**31 - 1
#: A gather marks a row or column past its tile with -2^30 (``-(1 << 30)``); adding a
#: tap's offset (less than the padded extent) must leave it negative.
EXTENT_MAX = 2**30 - 1
#: The largest tile edge (block_m, block_n, block_k): an index runs up to a count plus one tile.
TILE = 256
GRID_X_MAX = 2**31 - 1
GRID_YZ_MAX = 65535
#: Not an int limit but one of emission: strided dgrad emits one residue class (a template
#: instantiation of the whole main loop) per stride position, SH*SW of them.  256 covers a
#: 16x16 patchify stem; a stride of 2^30 would otherwise render 2^60 switch cases.
DGRAD_CLASSES_MAX = 256


class IndexLimitError(ValueError):
    """A shape the generated kernels cannot index with their 32-bit integers."""


def _fail(what: str, value: int, limit: int, why: str) -> None:
    raise IndexLimitError(f"{what} = {value} exceeds {limit}, the generated kernels' limit: {why}")


def check_geometry(g: ConvGeometry, pass_: Pass) -> None:
    """Reject a geometry whose shape values or per-image products overflow the kernels' ints."""
    for name in ("h", "w", "c", "k", "r", "s"):
        value = getattr(g, name)
        if value > INT_MAX:
            _fail(name, value, INT_MAX, "the kernels hold every shape value in a 32-bit int")
    for name in ("stride", "padding", "dilation"):
        for axis, value in zip(("height", "width"), getattr(g, name)):
            if value > INT_MAX:
                _fail(f"{name} ({axis})", value, INT_MAX, "the kernels hold every shape value in a 32-bit int")
    (ph, pw) = g.padding
    for what, extent in (("padded input height h + 2*padding", g.h + 2 * ph),
                         ("padded input width w + 2*padding", g.w + 2 * pw),
                         *((f"{name} ({axis})", v) for name in ("stride", "dilation")
                           for axis, v in zip(("height", "width"), getattr(g, name)))):
        if extent > EXTENT_MAX:
            _fail(what, extent, EXTENT_MAX,
                  "a gather's row and column indices are 32-bit ints, and rows past a tile are marked -2^30")
    pixels = (g.h + 2 * ph) * (g.w + 2 * pw)
    if pixels > INT_MAX:
        _fail(f"pixels per padded image (h + 2*padding) * (w + 2*padding) = {g.h + 2 * ph}*{g.w + 2 * pw}",
              pixels, INT_MAX, "a pixel's index within its image (P*Q, H*W) is a 32-bit int; only image offsets "
              "are 64-bit")
    rows = [("R*S*C (a weight row)", g.r * g.s * g.c)]
    if pass_ is Pass.DGRAD:
        rows.append(("R*S*K (dgrad's reduction)", g.r * g.s * g.k))
        classes = g.stride[0] * g.stride[1]
        if classes > DGRAD_CLASSES_MAX:
            raise IndexLimitError(
                f"dgrad's stride residue classes SH*SW = {g.stride[0]}*{g.stride[1]} = {classes} exceed "
                f"{DGRAD_CLASSES_MAX}: the dgrad kernel holds one main loop per class")
        for axis, stride, dil in zip(("height", "width"), g.stride, g.dilation):
            # A residue class's taps step by stride / gcd(stride, dilation); times the dilation
            # that is their lcm, a constexpr int (GatherDy's PSTEP, QSTEP).
            if math.lcm(stride, dil) > INT_MAX:
                _fail(f"lcm(stride, dilation) ({axis}, dgrad's tap step)", math.lcm(stride, dil), INT_MAX,
                      "it is a 32-bit int")
    for what, value in rows:
        if value > INT_MAX - TILE:
            _fail(what, value, INT_MAX - TILE, "reduction and weight-row indices are 32-bit ints, "
                  "counted up to one tile past the end")


def check_plan(g: ConvGeometry, pass_: Pass, plan: Plan) -> None:
    """Reject a plan whose grid or tile indices overflow for this geometry."""
    side_by_side = 1 if g.depthwise else g.groups  # a grouped GEMM's groups, along the grid's y
    gemm_n = g.group_gemm(pass_, 1) if side_by_side > 1 else g.gemm(pass_, 1)
    tiles_n = -(-gemm_n.n // plan.block_n) * side_by_side
    if tiles_n > GRID_YZ_MAX:
        groups = f"{g.groups} groups x " if side_by_side > 1 else ""
        _fail(f"output-column tiles {groups}ceil({gemm_n.n_axis} / block_n) = {groups}ceil({gemm_n.n} / {plan.block_n})",
              tiles_n, GRID_YZ_MAX, "they are the launch grid's y extent")
    if pass_ is Pass.DGRAD and not plan.halo and plan.block_k * g.r * g.s * g.c > INT_MAX:
        _fail("block_k * R*S*C (dgrad's weight step)", plan.block_k * g.r * g.s * g.c, INT_MAX,
              "a K-step's weight rows are offset in a 32-bit int")
    if pass_ is Pass.WGRAD and plan.split_k * g.k > INT_MAX:
        _fail("split_k * K (wgrad's db workspace)", plan.split_k * g.k, INT_MAX, "its index is a 32-bit int")


def check_batch(g: ConvGeometry, pass_: Pass, plan: Plan, batch: int) -> None:
    """Reject a batch size the kernels cannot count: ``int batch``, and wgrad's K-steps over N*P*Q."""
    if batch > INT_MAX - TILE:
        _fail("batch size n", batch, INT_MAX - TILE, "the kernels take it as a 32-bit int and round it up to whole tiles")
    if pass_ is Pass.WGRAD:
        steps = -(-batch * g.p * g.q // plan.block_k)
        limit = INT_MAX - plan.split_k - plan.stages
        if steps > limit:
            _fail(f"wgrad's K-steps ceil(N*P*Q / block_k) = ceil({batch * g.p * g.q} / {plan.block_k})", steps,
                  limit, "the reduction over the batch's pixels counts its steps in a 32-bit int")


def check_index_limits(problem: ConvGeometry, pass_: Pass | str, plan: Plan) -> None:
    """Everything a spec can be checked for: the geometry, the plan, and the batch when the
    problem has one (a :class:`ConvProblem`).  Raises :class:`IndexLimitError` (a ValueError)."""
    pass_ = Pass.parse(pass_)
    check_geometry(problem, pass_)
    check_plan(problem, pass_, plan)
    if isinstance(problem, ConvProblem):
        check_batch(problem, pass_, plan, problem.n)


def check_launch(source: "KernelSource", batch: int) -> None:
    """At launch: the batch (see :func:`check_batch`) and the grid's x extent of each kernel."""
    spec = source.spec
    check_batch(spec.geometry, spec.pass_, spec.plan, batch)
    for launch in (source.main, source.reduce):
        if launch is not None and launch.grid_x(batch) > GRID_X_MAX:
            _fail(f"{launch.kernel}'s grid x extent for batch {batch}", launch.grid_x(batch), GRID_X_MAX,
                  "a launch grid's x extent is at most 2^31 - 1 blocks")
