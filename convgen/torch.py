"""PyTorch front end: convgen's kernels as a differentiable ``conv2d`` and a drop-in ``nn.Conv2d``.

    import convgen.torch as cgt
    y = cgt.conv2d(x, w, bias, stride=1, padding=1)     # x (N, C, H, W), w (K, C, R, S), CUDA
    layer = cgt.Conv2d(64, 128, 3, padding=1)          # same arguments, parameters and state_dict as nn.Conv2d
    dw = cgt.Conv2d(64, 64, 3, padding=1, groups=64)   # depthwise (groups = C); any groups dividing C and K

PyTorch is an optional dependency: it is imported here and nowhere else, so
``import convgen`` never loads it.  CuPy is imported on the first launch, so
modules can be built, loaded and saved on a machine without it.

Layouts.  The PyTorch API is PyTorch's: ``x`` has nn.Conv2d's logical shape
(N, C, H, W) and ``w`` is (K, C/groups, R, S).  convgen's kernels read NHWC activations
and KRSC weights, which is exactly the memory of a ``channels_last`` tensor: for
a channels_last float16 (or bfloat16) ``x``, ``x.permute(0, 2, 3, 1)`` is a contiguous
NHWC view and goes to the kernel with no copy.  Any other layout or dtype (a
contiguous NCHW tensor, float32) is converted first, in one pass, never misread.
The weight is small and is permuted to KRSC (a copy unless it is already
channels_last float16).  Outputs come back in channels_last memory with the
logical shape PyTorch expects: y is (N, K, P, Q), dx is x's shape, dw is w's.

Precision.  The kernels multiply 16-bit operands and accumulate in float32: bfloat16 where x
or w is bfloat16 (a bfloat16 model), float16 otherwise.  ``x`` decides the output dtype:
float16 in, float16 out; bfloat16 in, bfloat16 out; float32 (or float64) in, float32
(float64) out, but computed from operands rounded to the 16-bit type with a float32
accumulator, i.e. the precision of autocast, not of an FP32 cuDNN convolution.  Gradients
come back in the dtype of the tensor they belong to, and the incoming gradient dy is
rounded to the 16-bit type before dgrad and wgrad, as an autocast backward would do (in
float16, values under 6e-8 flush to zero: scale the loss, as one does for any float16
training).  A float16 operand beside a bfloat16 one is refused (F.conv2d refuses it too).
Under ``torch.autocast("cuda")`` the operands are cast to the autocast type first (float16
or bfloat16), as nn.Conv2d's are, so the output has that type and the kernels multiply it.

Streams and graphs.  Every launch goes on PyTorch's current stream of the tensors'
device, with no synchronisation and no host copies, so the layer can be captured by
``torch.cuda.graph``.  Kernels are compiled on their first call: run a step (a warm-up, as
PyTorch's graph recipe does anyway) before capturing.

Operators.  The three passes are registered PyTorch operators (``convgen::conv2d``,
``convgen::conv2d_dgrad``, ``convgen::conv2d_wgrad``, through ``torch.library.Library``)
with fake implementations and an autograd formula, so ``torch.compile`` traces a model built
from :class:`Conv2d` with no graph break (``fullgraph=True``) and its CUDA-graph mode
(``mode="reduce-overhead"``) captures the kernels.  Eager calls run the same
implementations through an autograd Function instead, since the operator dispatcher costs
about a launch's host time of its own.  Where their operands are channels_last 16-bit
tensors, the operators take the eager path's FastConv too.

Memory and host cost.  Outputs and split-K workspaces are PyTorch tensors (PyTorch's caching
allocator; under graph capture, the graph's private pool), and so is every converted
operand: the kernels get the tensors' device pointers through a prepared op's
:meth:`~convgen.prepared.PreparedConv.launch`, so a call builds no CuPy array, enters no
CuPy context and allocates nothing outside PyTorch (the host cost this saves is measured
in benchmarks/NOTES.md, thirteenth session).  An eager call whose operands the kernels read
as they are (channels_last float16 or bfloat16) goes through a
``convgen.torch_launch.FastConv``, built on its signature's first call once the checks
passed, which fixes the geometry and the ops:
an eager training loop is host-bound, so a repeat call does no more than allocate and launch
(fourteenth session).
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

import convgen
from convgen import torch_launch as _tl
from convgen.ir import as_pair
from convgen.torch_args import (_PairArg, _autocast_cast, _autocast_dtype, _autocast_off, _autocasting,
                                _check_module_options, _check_operands, _plan_padding)
from convgen.torch_launch import (_bias_key, _device_index, _dgrad_impl, _elem, _fprop_impl, _geo, _out_dtype, _output_hw,
                                  _wgrad_impl)

__all__ = ["conv2d", "Conv2d", "precompile"]


# --------------------------------------------------------------------------- operators and autograd
# Registered PyTorch operators, so torch.compile traces a convgen layer as one node (no graph
# break) and CUDA-graph modes capture it; the fake implementations give the outputs' shapes,
# dtypes and channels_last strides without running anything.

_GEO_SCHEMA = "int[] stride, int[] padding, int[] dilation, int groups"

# Defined through torch.library.Library, not torch.library.custom_op: a custom_op call adds a
# Python wrapper (an aliasing check of every output, and its own autograd layer): stubbed, a
# call cost 17.7 / 21.2 / 30.2 us (fprop / dgrad / wgrad) as custom_op and 14.3 / 11.7 / 12.8
# as the Library's on the CPU machine.  torch.compile's graphs call these operators on every
# step that CUDA graphs do not capture; on the H100 host a call cost 54-63 us against the
# eager path's 20.  Two parts of that, found on the CPU machine (21.3 -> 11.6 us a stubbed
# fprop call, benchmarks/NOTES.md, thirty-third session), are gone: the implementations'
# general path (the operators take a FastConv too) and register_autograd's generic kernel
# (the Autograd kernels below).  The fakes are registered as custom_op registers them.
_LIB = torch.library.Library("convgen", "DEF")  # the operators live as long as this object
_LIB.define(f"conv2d(Tensor x, Tensor w, Tensor? bias, {_GEO_SCHEMA}) -> Tensor")
_LIB.define(f"conv2d_dgrad(Tensor gy, Tensor w, int[] x_shape, ScalarType x_dtype, {_GEO_SCHEMA}) -> Tensor")
_LIB.define(f"conv2d_wgrad(Tensor gy, Tensor x, int[] w_shape, ScalarType w_dtype, ScalarType? b_dtype, "
            f"{_GEO_SCHEMA}) -> (Tensor, Tensor)")


def _fprop_kernel(x, w, bias, stride, padding, dilation, groups):
    fast = _tl.operator_fprop(x, w, bias, stride, padding, dilation, groups)
    if fast is not None:
        return fast(x, w, bias)
    return _fprop_impl(x, w, bias, stride, padding, dilation, groups)


def _dgrad_kernel(gy, w, x_shape, x_dtype, stride, padding, dilation, groups):
    fast = _tl.operator_dgrad(gy, w, x_shape, x_dtype, stride, padding, dilation, groups)
    grads = None if fast is None else fast.grads(gy, None, w, (True, False, False))
    if grads is not None:
        return grads[0]
    return _dgrad_impl(gy, w, x_shape, x_dtype, stride, padding, dilation, groups)


def _wgrad_kernel(gy, x, w_shape, w_dtype, b_dtype, stride, padding, dilation, groups):
    fast = _tl.operator_wgrad(gy, x, w_shape, w_dtype, b_dtype, stride, padding, dilation, groups)
    grads = None if fast is None else fast.grads(gy, x, None, (False, True, b_dtype is not None))
    if grads is not None:
        _, dw, db = grads
        return dw, db if db is not None else torch.empty((0,), dtype=dw.dtype, device=dw.device)
    return _wgrad_impl(gy, x, w_shape, w_dtype, b_dtype, stride, padding, dilation, groups)


for _name, _kernel in (("conv2d", _fprop_kernel), ("conv2d_dgrad", _dgrad_kernel), ("conv2d_wgrad", _wgrad_kernel)):
    _LIB.impl(_name, _kernel, "CompositeExplicitAutograd")  # every device: the implementations name a wrong one


@torch.library.register_fake("convgen::conv2d", lib=_LIB)
def _(x, w, bias, stride, padding, dilation, groups):
    # Plain arithmetic, not ConvGeometry: under dynamic shapes the sizes are symbolic.
    n, _, h, wd = x.shape
    k, _, r, s = w.shape
    p = (h + 2 * padding[0] - dilation[0] * (r - 1) - 1) // stride[0] + 1
    q = (wd + 2 * padding[1] - dilation[1] * (s - 1) - 1) // stride[1] + 1
    return torch.empty((n, k, p, q), dtype=x.dtype, device=x.device, memory_format=torch.channels_last)


@torch.library.register_fake("convgen::conv2d_dgrad", lib=_LIB)
def _(gy, w, x_shape, x_dtype, stride, padding, dilation, groups):
    return torch.empty(tuple(x_shape), dtype=x_dtype, device=gy.device, memory_format=torch.channels_last)


@torch.library.register_fake("convgen::conv2d_wgrad", lib=_LIB)
def _(gy, x, w_shape, w_dtype, b_dtype, stride, padding, dilation, groups):
    # w_shape is torch's (K, C/groups, R, S): dw has the weight's shape.
    dw = torch.empty(tuple(w_shape), dtype=w_dtype, device=x.device, memory_format=torch.channels_last)
    db = torch.empty((w_shape[0],) if b_dtype is not None else (0,), dtype=b_dtype or w_dtype, device=x.device)
    return dw, db


def _setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    x, w, bias, stride, padding, dilation, groups = inputs
    need_dx, need_dw, _ = ctx.needs_input_grad[:3]
    # Keep only what the requested gradients read: x for wgrad, w for dgrad.
    ctx.save_for_backward(x if need_dw else None, w if need_dx else None)
    ctx.x_meta = (tuple(x.shape), x.dtype)
    ctx.w_meta = (tuple(w.shape), w.dtype)
    ctx.b_dtype = None if bias is None else bias.dtype
    ctx.geo = (list(stride), list(padding), list(dilation), groups)  # what dgrad and wgrad take after the shapes


def _grads(ctx: Any, gy: torch.Tensor, dgrad: Any, wgrad: Any):
    """dgrad and wgrad, each only when autograd asks for it (through the operators when
    traced, through their implementations when eager)."""
    need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
    x, w = ctx.saved_tensors
    dx = dw = db = None
    if need_dx:
        dx = dgrad(gy, w, list(ctx.x_meta[0]), ctx.x_meta[1], *ctx.geo)
    if need_dw:
        dw, db_ = wgrad(gy, x, list(ctx.w_meta[0]), ctx.w_meta[1], ctx.b_dtype if need_db else None, *ctx.geo)
        db = db_ if need_db else None
    elif need_db:
        # Only the bias trains: db is a plain reduction of dy (rounded to the 16-bit type, as
        # the kernels see it), not worth a wgrad launch.
        elem = _tl._TORCH[_elem(ctx.x_meta[1], ctx.w_meta[1])]
        db = gy.to(elem).sum(dim=(0, 2, 3), dtype=torch.float32).to(ctx.b_dtype)
    return dx, dw, db, None, None, None, None


# The operators' autograd kernels, registered at the Autograd key as torch.library.register_autograd
# registers its own.  Written out because that generic kernel cost about 6 us a call on the CPU
# machine (a dataclass of metadata, the schema's defaults filled in, a redispatch back into
# Python) on the calls torch.compile's graphs make, which need no gradient: here such a call
# goes straight to the implementation when nothing sits between autograd and the backend (no
# fake or functional tensor, no dispatch mode), and redispatches otherwise, as that kernel does.
_AFTER_AUTOGRAD = torch._C._after_autograd_keyset
_BACKENDS = (torch._C.DispatchKey.CUDA, torch._C.DispatchKey.CPU)  # (CPU: the CPU tests' tensors)


def _below_autograd(op: Any, keyset: Any, args: tuple) -> Any:
    with torch._C._AutoDispatchBelowAutograd():
        return op.redispatch(keyset & _AFTER_AUTOGRAD, *args)


class _Conv2dOperator(torch.autograd.Function):
    """convgen::conv2d where a gradient is recorded (the dispatch keyset rides last)."""

    @staticmethod
    def forward(ctx: Any, *args: Any) -> torch.Tensor:
        y = _below_autograd(torch.ops.convgen.conv2d.default, args[-1], args[:-1])
        _setup_context(ctx, args[:-1], y)
        return y

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor):
        # dgrad and wgrad through their operators, so a traced backward holds them as nodes.
        return (*_grads(ctx, gy, torch.ops.convgen.conv2d_dgrad, torch.ops.convgen.conv2d_wgrad), None)


class _GradientOperator(torch.autograd.Function):
    """convgen::conv2d_dgrad or _wgrad where a gradient is recorded: a double backward
    through them raises, never skips (the operator rides first, the keyset last)."""

    @staticmethod
    def forward(ctx: Any, op: Any, *args: Any) -> Any:
        return _below_autograd(op, args[-1], args[:-1])

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor):
        raise RuntimeError("convgen's dgrad and wgrad operators have no derivative of their own: a double backward "
                           "through a convgen convolution is not supported")


def _autograd_kernel(op: Any, recorded: Any, kernel: Any) -> Any:
    """The Autograd-key kernel of ``op``: ``recorded(*args, keyset)`` where a gradient is
    recorded, else ``kernel`` itself or, with anything between autograd and the backend,
    the redispatch."""
    def autograd(keyset: Any, *args: Any) -> Any:
        if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
            return recorded(*args, keyset)
        if (keyset & _AFTER_AUTOGRAD).highestPriorityTypeId() in _BACKENDS:
            return kernel(*args)
        return _below_autograd(op, keyset, args)
    return autograd


for _name, _kernel in (("conv2d", _fprop_kernel), ("conv2d_dgrad", _dgrad_kernel), ("conv2d_wgrad", _wgrad_kernel)):
    _op = getattr(torch.ops.convgen, _name).default
    _recorded = _Conv2dOperator.apply if _name == "conv2d" else functools.partial(_GradientOperator.apply, _op)
    _LIB.impl(_name, _autograd_kernel(_op, _recorded, _kernel), "Autograd", with_keyset=True)
# The operator called directly under autocast casts its inputs to float16 (register_autocast
# takes one type).  convgen.torch's own calls cast to the autocast type first and call it
# with autocast off (_conv2d), so a bfloat16 autocast gets bfloat16 kernels.
torch.library.register_autocast("convgen::conv2d", "cuda", torch.float16)


# The layers a precompile() forward met, as the keys _op() will look them up by; None when
# not recording.
_recording: Optional[list[tuple]] = None


def _record(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], stride: Sequence[int],
            padding: Sequence[int], dilation: Sequence[int], groups: int, needs: Sequence[bool]) -> torch.Tensor:
    """Note the ops a training step of this layer will want, as _fprop_impl, _dgrad_impl and
    _wgrad_impl key them; the output is zeros of the right shape and layout, nothing runs."""
    assert _recording is not None
    n, c, h, wd = x.shape
    k, cw, r, s = w.shape  # cw = C/groups
    geo = _geo(stride, padding, dilation)
    p, q = _output_hw(h, wd, c, k, r, s, geo)
    shapes = ((n, h, wd, c), (k, r, s, cw))
    index = _device_index(x)
    need_dx, need_dw, need_db = needs
    elem = _elem(x.dtype, w.dtype)
    b_key = _bias_key(None if bias is None else bias.dtype, elem)
    _recording.append(("fprop", *shapes, geo, b_key, _out_dtype(elem, x.dtype), index, groups, elem))
    if need_dx:
        _recording.append(("dgrad", *shapes, geo, False, _out_dtype(elem, x.dtype), index, groups, elem))
    if need_dw:
        b_dtype = bias.dtype if need_db and bias is not None else None
        _recording.append(("wgrad", *shapes, geo, b_dtype is not None, _out_dtype(elem, w.dtype, b_dtype), index,
                           groups, elem))
    return torch.empty((n, k, p, q), dtype=x.dtype, device=x.device, memory_format=torch.channels_last).zero_()


def precompile(model: nn.Module, *example_inputs: Any, workers: Optional[int] = None) -> int:
    """Compile, in parallel, every kernel a training step of ``model`` on inputs shaped like
    ``example_inputs`` will launch: each convgen layer's forward, its dgrad where its input
    needs a gradient, and its wgrad (with db where the bias trains).  Returns how many ops
    were prepared.

    The first step of a network otherwise compiles its kernels one by one as the layers
    first run.  This runs the model's forward once in eval mode, with gradients on and the
    convolutions replaced by zeros of their outputs' shape (no kernel runs, and no batch
    norm statistic moves), to learn the layers, then builds all their ops through
    :func:`convgen.prepare_many`.  Compiled binaries also land in the disk cache, so the next
    process loads them.  Call it as the step calls the model (under the same
    ``torch.autocast``, on inputs of the step's shapes and dtypes): ops are keyed by what the
    kernels see, and a step that differs only builds its own ops as it would have anyway."""
    global _recording
    if _recording is not None:
        raise RuntimeError("convgen.torch.precompile is already running (it is not reentrant)")
    was_training = model.training
    _recording = []
    try:
        model.eval()
        with torch.enable_grad():
            model(*example_inputs)
        keys = list(dict.fromkeys(_recording))  # each op once, in the order met
    finally:
        _recording = None
        model.train(was_training)
    todo = [key for key in keys if key not in _tl._prepared]
    for key, op in zip(todo, convgen.prepare_many([_tl._prepare_args(key) for key in todo], workers=workers)):
        _tl._prepared[key] = op
    return len(keys)


class _EagerConv2d(torch.autograd.Function):
    """The operator's forward and backward without the operator dispatcher, for eager calls.

    An operator call (then a ``torch.library.custom_op``) cost about 100 us of host time on the H200 machine
    against 17 us for ``F.conv2d`` (benchmarks/probes/host_cost.py), and eager training
    loops are host-bound.  So eager calls take this Function, which runs the same
    implementations, and only code that torch.compile traces goes through the operators.
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float16)
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], stride: list,
                padding: list, dilation: list, groups: int) -> torch.Tensor:
        if _recording is not None:  # precompile(): note the layer, run nothing
            return _record(x, w, bias, stride, padding, dilation, groups, ctx.needs_input_grad[:3])
        y = _fprop_impl(x, w, bias, stride, padding, dilation, groups)
        _setup_context(ctx, (x, w, bias, stride, padding, dilation, groups), y)
        return y

    @staticmethod
    @once_differentiable  # the backward is kernels, not torch ops: no double backward, and say so
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx: Any, gy: torch.Tensor):
        return _grads(ctx, gy, _dgrad_impl, _wgrad_impl)


class _FastEagerConv2d(torch.autograd.Function):
    """_EagerConv2d for a call signature the kernels read as it is (a FastConv): the same
    kernels, with everything a call would re-derive fixed in the FastConv, so an eager
    training step's host cost is the launch and little more."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor],
                fast: _tl.FastConv) -> torch.Tensor:
        need_dx, need_dw, _ = ctx.needs_input_grad[:3]
        ctx.save_for_backward(x if need_dw else None, w if need_dx else None)
        ctx.fast = fast
        return fast(x, w, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, gy: torch.Tensor):
        x, w = ctx.saved_tensors
        fast = ctx.fast
        grads = fast.grads(gy, x, w, ctx.needs_input_grad[:3])
        if grads is None:  # a gradient of another layout or dtype: the implementations convert it
            ctx.x_meta, ctx.w_meta = (fast.x_shape, fast.dtype), (fast.w_shape, fast.dtype)
            ctx.b_dtype, ctx.geo = fast.b_dtype, fast.geo_lists
            return _grads(ctx, gy, _dgrad_impl, _wgrad_impl)[:3] + (None,)
        return (*grads, None)


def _differentiates(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor]) -> bool:
    return torch.is_grad_enabled() and (x.requires_grad or w.requires_grad
                                        or (bias is not None and bias.requires_grad))


def _run_fast(fast: _tl.FastConv, x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """A FastConv's forward, through its autograd Function only when a gradient is recorded."""
    return _FastEagerConv2d.apply(x, w, bias, fast) if _differentiates(x, w, bias) else fast(x, w, bias)


def _conv2d(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], stride: _PairArg,
            padding: Union[_PairArg, str], dilation: _PairArg, groups: int = 1) -> torch.Tensor:
    """Everything of :func:`conv2d` except the CUDA check (the CPU tests drive this with a NumPy bridge)."""
    if isinstance(x, torch.Tensor) and x.dim() == 3:  # unbatched (C, H, W), as nn.Conv2d allows
        return _conv2d(x.unsqueeze(0), w, bias, stride, padding, dilation, groups).squeeze(0)
    if _autocasting():
        # nn.Conv2d's autocast rule: its floating operands in the autocast type, float16 or
        # bfloat16 (float64 left as it is), then the convolution with autocast off, so the
        # kernels, the fast path and the operator all see the type the user asked for.
        dt = _autocast_dtype()
        x, w, bias = (_autocast_cast(t, dt) for t in (x, w, bias))
        with _autocast_off():
            return _conv2d_as_is(x, w, bias, stride, padding, dilation, groups)
    return _conv2d_as_is(x, w, bias, stride, padding, dilation, groups)


def _conv2d_as_is(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], stride: _PairArg,
                  padding: Union[_PairArg, str], dilation: _PairArg, groups: int) -> torch.Tensor:
    """:func:`_conv2d` on operands of the dtypes they have, with autocast off."""
    compiling = torch.compiler.is_compiling()
    sig = None
    if not compiling and _recording is None:
        # A signature met before, that the kernels read as it is: its FastConv, no checks
        # (they passed for this signature) and no conversions.
        try:
            sig = _tl.signature(x, w, bias, stride, padding, dilation, groups)
            fast = _tl.fast_calls.get(sig)
        except (AttributeError, TypeError):  # not tensors (the checks say so), or list arguments
            sig = fast = None
        if fast is not None:
            return _run_fast(fast, x, w, bias)
    _check_operands(x, w, bias, groups)
    key = (stride, padding, dilation, w.shape[2], w.shape[3])
    remember = not compiling
    try:
        found = _kernel_geometry.get(key) if remember else None
    except TypeError:  # a list argument: not a key, and nothing to remember
        found, remember = None, False
    if found is None:
        stride_ = as_pair("stride", stride)
        dilation_ = as_pair("dilation", dilation)
        pad, extra = _plan_padding(padding, (w.shape[2], w.shape[3]), stride_, dilation_)
        found = (stride_, pad, dilation_, extra)
        if remember:
            _kernel_geometry[key] = found
    stride_, pad, dilation_, extra = found
    if extra != (0, 0):
        x = F.pad(x, (0, extra[1], 0, extra[0]))
    args = (x, w, bias, list(stride_), list(pad), list(dilation_), groups)
    if compiling:
        return torch.ops.convgen.conv2d.default(*args)
    if _recording is None:
        if sig is not None and extra == (0, 0) and _tl.FastConv.fits(x, w, bias):
            fast = _tl.fast_calls[sig] = _tl.FastConv.of(*args)
            return _run_fast(fast, x, w, bias)
        if not _differentiates(x, w, bias):
            return _fprop_impl(*args)  # nothing to differentiate: the autograd Function's apply is overhead
    return _EagerConv2d.apply(*args)


# conv2d's arguments as the kernels take them, per (stride, padding, dilation, R, S) as
# given: checked and normalised once (a few microseconds a call otherwise), eager calls only.
_kernel_geometry: dict[tuple, tuple] = {}


def conv2d(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor] = None, stride: _PairArg = 1,
           padding: Union[_PairArg, str] = 0, dilation: _PairArg = 1, groups: int = 1) -> torch.Tensor:
    """``F.conv2d`` on convgen's kernels, differentiable in x, w and bias.

    x: (N, C, H, W) or (C, H, W); w: (K, C/groups, R, S); bias: (K,) or None; stride,
    padding, dilation: an int or an (h, w) pair; padding may also be 'same' or
    'valid'.  groups: as in F.conv2d (dividing C and K; groups = C is depthwise).  Returns y of logical shape
    (N, K, P, Q) in channels_last memory, of x's dtype (see the module docstring for the
    precision).  Needs CUDA tensors.
    """
    if isinstance(x, torch.Tensor) and x.device.type != "cuda":
        raise RuntimeError(
            f"convgen.torch.conv2d needs CUDA tensors (convgen's kernels run on an NVIDIA GPU), "
            f"but x is on {x.device}. Move the module and its input to a GPU (.cuda()), "
            "or use torch.nn.functional.conv2d / torch.nn.Conv2d on the CPU."
        )
    return _conv2d(x, w, bias, stride, padding, dilation, groups)


class Conv2d(nn.Conv2d):
    """A drop-in ``torch.nn.Conv2d`` whose forward and backward run convgen's kernels.

    It *is* an nn.Conv2d (same constructor, parameters ``weight`` (K, C, R, S)
    and ``bias``, initialisation and state_dict keys), so a checkpoint of either
    loads into the other.  Only what the kernels compute is accepted: groups dividing
    in_channels and out_channels (the weight is then (K, C/groups, R, S); groups =
    in_channels is depthwise), and padding_mode='zeros' (anything else raises ValueError here
    rather than computing something else later).  Inputs must be CUDA tensors; channels_last
    float16 (or bfloat16) activations take the zero-copy path.
    """

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: _PairArg, stride: _PairArg = 1,
        padding: Union[_PairArg, str] = 0, dilation: _PairArg = 1, groups: int = 1, bias: bool = True,
        padding_mode: str = "zeros", device: Any = None, dtype: Any = None,
    ) -> None:
        _check_module_options(in_channels, out_channels, groups, padding_mode)
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, device, dtype)

    def _conv_forward(self, input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        if self.groups != 1 or self.padding_mode != "zeros":  # attributes can be changed after __init__
            _check_module_options(self.in_channels, self.out_channels, self.groups, self.padding_mode)
        if input.device.type != "cuda":
            raise RuntimeError(
                f"convgen.torch.Conv2d runs on a CUDA GPU only, but its input is on {input.device}. "
                "Move the module and its input to the GPU (.cuda()), or use torch.nn.Conv2d on the CPU "
                "(its state_dict is interchangeable with this module's)."
            )
        return conv2d(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(input, self.weight, self.bias)
