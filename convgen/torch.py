"""PyTorch front end: convgen's kernels as a differentiable ``conv2d`` and a drop-in ``nn.Conv2d``.

    import convgen.torch as cgt
    y = cgt.conv2d(x, w, bias, stride=1, padding=1)     # x (N, C, H, W), w (K, C, R, S), CUDA
    layer = cgt.Conv2d(64, 128, 3, padding=1)          # same arguments, parameters and state_dict as nn.Conv2d

PyTorch is an optional dependency: it is imported here and nowhere else, so
``import convgen`` never loads it.  CuPy is imported on the first launch, so
modules can be built, loaded and saved on a machine without it.

Layouts.  The PyTorch API is PyTorch's: ``x`` has nn.Conv2d's logical shape
(N, C, H, W) and ``w`` is (K, C, R, S).  convgen's kernels read NHWC activations
and KRSC weights, which is exactly the memory of a ``channels_last`` tensor: for
a channels_last float16 ``x``, ``x.permute(0, 2, 3, 1)`` is a contiguous NHWC
view and goes to the kernel with no copy.  Any other layout or dtype (a
contiguous NCHW tensor, float32) is converted first, in one pass, never misread.
The weight is small and is permuted to KRSC (a copy unless it is already
channels_last float16).  Outputs come back in channels_last memory with the
logical shape PyTorch expects: y is (N, K, P, Q), dx is x's shape, dw is w's.

Precision.  The kernels multiply float16 operands and accumulate in float32.
``x`` decides the output dtype: float16 in, float16 out; float32 (or float64)
in, float32 (float64) out, but computed from float16-rounded operands with a
float32 accumulator, i.e. the precision of autocast, not of an FP32 cuDNN
convolution.  Gradients come back in the dtype of the tensor they belong to,
and the incoming gradient dy is rounded to float16 before dgrad and wgrad, as
an autocast backward would do (values under 6e-8 flush to zero: scale the loss,
as one does for any float16 training).  bfloat16 is refused: its range does not
fit in float16.  Under ``torch.autocast("cuda")`` the inputs are cast to float16
first, like nn.Conv2d's under a float16 autocast, so the output is float16 (also
under a bfloat16 autocast, where nn.Conv2d's would be bfloat16: convgen has no
bfloat16 kernels).

Streams and graphs.  Every launch goes on PyTorch's current stream of the
tensors' device (CuPy is pointed at that stream around the call), with no
synchronisation and no host copies, so the layer can be captured by
``torch.cuda.graph``.  Kernels are compiled on their first call: run a step (a
warm-up, as PyTorch's graph recipe does anyway) before capturing.

Memory.  Everything CuPy allocates during a call (outputs, converted operands,
split-K workspaces) comes from PyTorch's caching allocator, not CuPy's memory
pool.  Two reasons.  Under graph capture PyTorch hands the capturing stream a
private pool whose blocks stay reserved for the graph's replays; CuPy's pool
would reuse a freed block for other work while the graph still owns it (and
its cudaMalloc is illegal during a capture).  Outside capture, one allocator
means one cache: memory freed by convgen is reusable by PyTorch and the other
way round, and ``torch.cuda.memory_allocated`` sees it.  This is CuPy's
documented ``PythonFunctionAllocator`` around ``torch.cuda.caching_allocator_alloc``
/ ``caching_allocator_delete`` (PyTorch's interoperability API), allocating on
the current stream, installed with ``cupy.cuda.using_allocator`` only for the
duration of convgen's calls and only in the calling thread: CuPy's global
allocator, and any CuPy code of the user, are left alone.

One caveat of the DLPack hand-over: the storage of a returned tensor is owned
by a CuPy array, so ``Tensor.record_stream`` does not reach PyTorch's
allocator for it.  Using an output on a second stream and freeing it before
that stream is done needs an explicit ``wait_stream`` (as for any DLPack import).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any, Iterator, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

import convgen
from convgen.ir import ConvGeometry, as_pair

__all__ = ["conv2d", "Conv2d"]

_PairArg = Union[int, Sequence[int]]
_SUPPORTED_DTYPES = (torch.float16, torch.float32, torch.float64)


# --------------------------------------------------------------------------- argument handling


def _plan_padding(
    padding: Union[_PairArg, str], kernel: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int]
) -> tuple[tuple[int, int], tuple[int, int]]:
    """(symmetric padding for the kernels, extra (bottom, right) zeros to pad onto x first).

    'same' follows PyTorch exactly: a dilated filter extent of d*(k-1)+1 needs
    d*(k-1) padding in total, split as total//2 before and the rest after.  When
    the total is odd the split is uneven, which convgen's kernels (symmetric
    padding only) cannot express, so the one extra row/column goes onto the
    input with ``F.pad`` first, as ATen's own 'same' convolution does.
    """
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0), (0, 0)
        if padding != "same":
            raise ValueError(f"Invalid padding string {padding!r}, should be one of ('valid', 'same')")
        if stride != (1, 1):
            raise ValueError("padding='same' is not supported for strided convolutions")
        sym, extra = [], []
        for k, d in zip(kernel, dilation):
            total = d * (k - 1)
            sym.append(total // 2)
            extra.append(total - 2 * (total // 2))
        return (sym[0], sym[1]), (extra[0], extra[1])
    return as_pair("padding", padding), (0, 0)


def _check_operands(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
    """Reject what the kernels would compute wrongly, naming the argument at fault."""
    for name, t in (("x", x), ("w", w), ("bias", bias)):
        if t is None and name == "bias":
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _SUPPORTED_DTYPES:
            hint = (" (bfloat16's range does not fit in float16, which the kernels compute with;"
                    " convert to float16 or float32)") if t.dtype == torch.bfloat16 else ""
            raise TypeError(f"{name} must be float16, float32 or float64, got {t.dtype}{hint}")
        if t.device != x.device:
            raise RuntimeError(f"{name} is on {t.device} but x is on {x.device}; all operands must be on one device")
    if x.dim() != 4:
        raise ValueError(f"x must be 4-D (N, C, H, W) or 3-D (C, H, W), got shape {tuple(x.shape)}")
    if w.dim() != 4:
        raise ValueError(f"w must be 4-D (K, C, R, S) like nn.Conv2d.weight, got shape {tuple(w.shape)}")
    if w.shape[1] != x.shape[1]:
        raise ValueError(
            f"w has {w.shape[1]} input channels (w.shape[1]) but x has {x.shape[1]} (x.shape[1]); "
            "convgen computes dense convolutions (groups=1) only"
        )
    if bias is not None and tuple(bias.shape) != (w.shape[0],):
        raise ValueError(f"bias must have shape ({w.shape[0]},) to match w's output channels, got {tuple(bias.shape)}")


def _out_dtype(*dtypes: Optional[torch.dtype]) -> str:
    """The kernels' output dtype: float16 only when everything it is for is float16 (wider
    dtypes get float32 out of the kernel, the exact accumulator, then widen if float64)."""
    return "float16" if all(d in (None, torch.float16) for d in dtypes) else "float32"


def _dense_half(view: torch.Tensor) -> torch.Tensor:
    """``view`` (already in the kernel's logical order: NHWC or KRSC) as a dense float16 tensor.

    No copy when it already is one: that is the zero-copy path of a channels_last
    float16 tensor.  Otherwise one fused cast-and-relayout copy.  Alignment is
    the runtime's job (it copies an operand whose pointer a vector load cannot use).
    """
    if view.dtype == torch.float16 and view.is_contiguous():
        return view
    out = torch.empty(view.shape, dtype=torch.float16, device=view.device)
    out.copy_(view)
    return out


def _nhwc_half(t: torch.Tensor) -> torch.Tensor:
    """(N, C, H, W) logical -> dense float16 (N, H, W, C); a view of ``t`` if it is channels_last float16."""
    return _dense_half(t.permute(0, 2, 3, 1))


# --------------------------------------------------------------------------- the CuPy bridge
# These three functions are the only place that touches CuPy, so that CPU tests can swap
# them for a NumPy bridge and exercise everything else (layouts, dtypes, padding, gradients).


def _cupy():
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "convgen.torch needs CuPy to launch kernels: pip install 'convgen[cuda13]' (or [cuda12])"
        ) from exc
    return cupy


class _NoSyncExport:
    """A DLPack producer for a tensor that the consumer reads on the tensor's own stream.

    ``cupy.from_dlpack`` hands the producer CuPy's current stream, and PyTorch then
    orders its current stream before it with an event.  We have pointed CuPy at
    PyTorch's current stream, so no ordering is needed, but PyTorch cannot tell
    (it wraps the pointer as a new external stream object that compares unequal
    to its own) and would create, record and wait on an event for every operand,
    which also adds nodes to a captured graph.  ``stream=-1`` is DLPack's "the
    consumer needs no synchronisation".
    """

    __slots__ = ("_t",)

    def __init__(self, t: torch.Tensor) -> None:
        self._t = t

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()

    def __dlpack__(self, *, stream: Any = None, **kwargs: Any):
        return self._t.__dlpack__(stream=-1, **kwargs)


_NUMPY_DTYPES = {torch.float16: "float16", torch.float32: "float32"}


def _as_array(t: torch.Tensor) -> Any:
    """The CuPy array on ``t``'s memory (zero copy, same strides; ``t`` must be detached).

    The operands convgen hands over (dense float16 activations and weights, a float32
    bias) are wrapped straight from their pointer, with the tensor as the memory's
    owner: a DLPack round trip cost about as much host time as a kernel launch
    (benchmarks/NOTES.md, "The training step is host-bound").  Anything else takes DLPack.
    """
    cupy = _cupy()
    dtype = _NUMPY_DTYPES.get(t.dtype)
    if dtype is None or not t.is_contiguous() or t.numel() == 0:
        return cupy.from_dlpack(_NoSyncExport(t))
    mem = cupy.cuda.UnownedMemory(t.data_ptr(), t.numel() * t.element_size(), t, t.device.index)
    return cupy.ndarray(tuple(t.shape), dtype, cupy.cuda.MemoryPointer(mem, 0))


def _as_tensor(a: Any) -> torch.Tensor:
    """The torch tensor on CuPy array ``a``'s memory (zero copy).  Called inside
    :func:`_launch_scope`, so PyTorch's and CuPy's current streams are one and
    the exchange synchronises nothing."""
    return torch.from_dlpack(a)


class _StreamHandle:
    """A raw stream pointer in the CUDA stream protocol (what ``Stream.from_external`` takes).
    Being the 'foreign' owner also stops CuPy from ever destroying PyTorch's stream."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.ptr)


class _ThreadState(threading.local):
    """Per thread: the stream of the launch scope the thread is in (what the allocator
    allocates on), and CuPy's wrappers of PyTorch's streams, built once per stream rather
    than once per call (a measurable part of a small layer's host time)."""

    def __init__(self) -> None:
        self.streams: dict[tuple[int, int], Any] = {}
        self.scope_stream: Optional[int] = None


_state = _ThreadState()


def _cupy_stream(cupy: Any, ptr: int, device: int) -> Any:
    stream = _state.streams.get((ptr, device))
    if stream is None:
        if hasattr(cupy.cuda.Stream, "from_external"):  # CuPy >= 14; ExternalStream is deprecated there
            stream = cupy.cuda.Stream.from_external(_StreamHandle(ptr))
        else:
            stream = cupy.cuda.ExternalStream(ptr, device)
        # A wrapper holds only the pointer; a stream PyTorch creates later at the same
        # address is the same stream to CUDA, so a stale entry is still right.
        _state.streams[(ptr, device)] = stream
    return stream


def _torch_malloc(size: int, device_id: int) -> int:
    # On the launch scope's stream, PyTorch's current one: under graph capture that is
    # the capturing stream, which is what routes the block into the graph's private pool.
    stream = _state.scope_stream
    if stream is None:  # not inside _launch_scope (never the case for convgen's own calls)
        stream = torch.cuda.current_stream(device_id).cuda_stream
    return torch.cuda.caching_allocator_alloc(size, device_id, stream)


def _torch_free(ptr: int, device_id: int) -> None:
    if sys.is_finalizing():  # interpreter shutdown: PyTorch may be gone; the driver reclaims all
        return
    torch.cuda.caching_allocator_delete(ptr)


_allocator: Any = None


def _torch_allocator(cupy: Any) -> Any:
    global _allocator
    if _allocator is None:
        _allocator = cupy.cuda.memory.PythonFunctionAllocator(_torch_malloc, _torch_free)
    return _allocator


@contextlib.contextmanager
def _launch_scope(device: torch.device) -> Iterator[None]:
    """Run convgen calls on ``device``, on PyTorch's current stream there, allocating
    from PyTorch's caching allocator (this thread only, for the duration of the block)."""
    cupy = _cupy()
    index = device.index if device.index is not None else torch.cuda.current_device()
    ptr = torch.cuda.current_stream(index).cuda_stream
    outer, _state.scope_stream = _state.scope_stream, ptr
    try:
        with torch.cuda.device(index), cupy.cuda.Device(index):
            with _cupy_stream(cupy, ptr, index), cupy.cuda.using_allocator(_torch_allocator(cupy).malloc):
                yield
    finally:
        _state.scope_stream = outer


# --------------------------------------------------------------------------- autograd


def _nchw_result(a: Any, dtype: torch.dtype) -> torch.Tensor:
    """An NHWC kernel output as a tensor of logical shape (N, C, H, W) in channels_last memory.

    The permutation is done on the CuPy side, so the tensor PyTorch builds has
    channels_last strides and is *not* a view: an output of a custom autograd
    Function that is a view cannot be modified in place (``nn.ReLU(inplace=True)``
    after the conv would raise).
    """
    t = _as_tensor(a.transpose(0, 3, 1, 2))
    return t if t.dtype == dtype else t.to(dtype)


class _Conv2dFunction(torch.autograd.Function):
    """fprop in forward; dgrad and wgrad in backward, each only when autograd asks for it."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float16)
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor],
                stride: tuple[int, int], padding: tuple[int, int], dilation: tuple[int, int]) -> torch.Tensor:
        need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
        n, c, h, wd = x.shape
        k, _, r, s = w.shape
        geo = ConvGeometry(h, wd, c, k, r, s, stride, padding, dilation)  # validates; gives P, Q
        ctx.geometry = (stride, padding, dilation)
        ctx.x_shape = (n, h, wd, c)
        ctx.w_shape = (k, r, s, c)
        ctx.dtypes = (x.dtype, w.dtype, None if bias is None else bias.dtype)
        ctx.empty = n == 0
        if n == 0:  # nothing to launch; the kernels' zero-size paths would hand DLPack a null pointer
            ctx.save_for_backward(None, None)
            return torch.empty((0, k, geo.p, geo.q), dtype=x.dtype, device=x.device,
                               memory_format=torch.channels_last)
        x16 = _nhwc_half(x.detach())
        w16 = _dense_half(w.detach().permute(0, 2, 3, 1))  # KRSC
        b32 = None if bias is None else bias.detach().to(torch.float32)  # the epilogue reads fp32
        with _launch_scope(x.device):
            y = convgen.conv2d(
                _as_array(x16), _as_array(w16), None if b32 is None else _as_array(b32),
                stride, padding, dilation, out_dtype=_out_dtype(x.dtype),
            )
            out = _nchw_result(y, x.dtype)
        # Keep only what the requested gradients read: x for wgrad, w for dgrad.
        ctx.save_for_backward(x16 if need_dw else None, w16 if need_dx else None)
        return out

    @staticmethod
    @once_differentiable  # the backward is kernels, not torch ops: no double backward, and say so
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx: Any, gy: torch.Tensor):
        need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
        x16, w16 = ctx.saved_tensors
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        stride, padding, dilation = ctx.geometry
        n, h, wd, c = ctx.x_shape
        k, r, s, _ = ctx.w_shape
        dx = dw = db = None
        if ctx.empty:  # an empty batch: zero weight gradients, an empty input gradient
            dev = gy.device
            if need_dx:
                dx = torch.empty((0, c, h, wd), dtype=x_dtype, device=dev, memory_format=torch.channels_last)
            if need_dw:
                dw = torch.zeros((k, c, r, s), dtype=w_dtype, device=dev)
            if need_db:
                db = torch.zeros((k,), dtype=b_dtype, device=dev)
            return dx, dw, db, None, None, None
        gy16 = _nhwc_half(gy.detach())  # dense NHWC float16 dy (a view when gy is channels_last fp16)
        if need_dx or need_dw:
            with _launch_scope(gy.device):
                dy = _as_array(gy16)
                if need_dx:
                    dxa = convgen.conv2d_dgrad(dy, _as_array(w16), ctx.x_shape, stride, padding, dilation,
                                               out_dtype=_out_dtype(x_dtype))
                    dx = _nchw_result(dxa, x_dtype)
                if need_dw:
                    dwa, dba = convgen.conv2d_wgrad(
                        _as_array(x16), dy, ctx.w_shape, stride, padding, dilation, bias=need_db,
                        out_dtype=_out_dtype(w_dtype, b_dtype if need_db else None),
                    )
                    dw = _nchw_result(dwa, w_dtype)  # KRSC -> (K, C, R, S), channels_last memory
                    if need_db:
                        db = _as_tensor(dba)
                        db = db if db.dtype == b_dtype else db.to(b_dtype)
        if need_db and db is None:
            # Only the bias trains: db is a plain reduction of dy, not worth a wgrad launch.
            db = gy16.sum(dim=(0, 1, 2), dtype=torch.float32).to(b_dtype)
        return dx, dw, db, None, None, None


def _conv2d(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], stride: _PairArg,
            padding: Union[_PairArg, str], dilation: _PairArg) -> torch.Tensor:
    """Everything of :func:`conv2d` except the CUDA check (the CPU tests drive this with a NumPy bridge)."""
    if isinstance(x, torch.Tensor) and x.dim() == 3:  # unbatched (C, H, W), as nn.Conv2d allows
        return _conv2d(x.unsqueeze(0), w, bias, stride, padding, dilation).squeeze(0)
    _check_operands(x, w, bias)
    stride_ = as_pair("stride", stride)
    dilation_ = as_pair("dilation", dilation)
    pad, extra = _plan_padding(padding, (w.shape[2], w.shape[3]), stride_, dilation_)
    if extra != (0, 0):
        x = F.pad(x, (0, extra[1], 0, extra[0]))
    return _Conv2dFunction.apply(x, w, bias, stride_, pad, dilation_)


def conv2d(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor] = None, stride: _PairArg = 1,
           padding: Union[_PairArg, str] = 0, dilation: _PairArg = 1) -> torch.Tensor:
    """``F.conv2d`` (groups=1) on convgen's kernels, differentiable in x, w and bias.

    x: (N, C, H, W) or (C, H, W); w: (K, C, R, S); bias: (K,) or None; stride,
    padding, dilation: an int or an (h, w) pair; padding may also be 'same' or
    'valid'.  Returns y of logical shape (N, K, P, Q) in channels_last memory, of
    x's dtype (see the module docstring for the precision).  Needs CUDA tensors.
    """
    if isinstance(x, torch.Tensor) and x.device.type != "cuda":
        raise RuntimeError(
            f"convgen.torch.conv2d needs CUDA tensors (convgen's kernels run on an NVIDIA GPU), "
            f"but x is on {x.device}. Move the module and its input to a GPU (.cuda()), "
            "or use torch.nn.functional.conv2d / torch.nn.Conv2d on the CPU."
        )
    return _conv2d(x, w, bias, stride, padding, dilation)


class Conv2d(nn.Conv2d):
    """A drop-in ``torch.nn.Conv2d`` whose forward and backward run convgen's kernels.

    It *is* an nn.Conv2d (same constructor, parameters ``weight`` (K, C, R, S)
    and ``bias``, initialisation and state_dict keys), so a checkpoint of either
    loads into the other.  Only what the kernels compute is accepted: groups=1
    and padding_mode='zeros' (anything else raises ValueError here rather than
    computing something else later).  Inputs must be CUDA tensors; channels_last
    float16 activations take the zero-copy path.
    """

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: _PairArg, stride: _PairArg = 1,
        padding: Union[_PairArg, str] = 0, dilation: _PairArg = 1, groups: int = 1, bias: bool = True,
        padding_mode: str = "zeros", device: Any = None, dtype: Any = None,
    ) -> None:
        _check_module_options(groups, padding_mode)
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, device, dtype)

    def _conv_forward(self, input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        _check_module_options(self.groups, self.padding_mode)  # attributes can be changed after __init__
        if input.device.type != "cuda":
            raise RuntimeError(
                f"convgen.torch.Conv2d runs on a CUDA GPU only, but its input is on {input.device}. "
                "Move the module and its input to the GPU (.cuda()), or use torch.nn.Conv2d on the CPU "
                "(its state_dict is interchangeable with this module's)."
            )
        return conv2d(input, weight, bias, self.stride, self.padding, self.dilation)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(input, self.weight, self.bias)


def _check_module_options(groups: int, padding_mode: str) -> None:
    if groups != 1:
        raise ValueError(
            f"convgen.torch.Conv2d supports groups=1 only, got groups={groups}: convgen's kernels compute "
            "dense convolutions; use torch.nn.Conv2d for grouped or depthwise layers"
        )
    if padding_mode != "zeros":
        raise ValueError(
            f"convgen.torch.Conv2d supports padding_mode='zeros' only, got {padding_mode!r}; "
            "use torch.nn.Conv2d for reflect, replicate or circular padding"
        )
