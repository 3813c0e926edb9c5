"""The kernel side of convgen.torch: PyTorch tensors in, a prepared op's launch out.

convgen.torch (the front end: arguments, operators, autograd, modules) hands this module
tensors it has checked; this module turns them into what the kernels read (dense NHWC / KRSC
of the call's 16-bit type, float16 or bfloat16: a copy only when the tensor is not that
already), allocates the outputs as channels_last PyTorch tensors and launches the layer's
prepared op on PyTorch's current stream.  Two paths: the implementations (``_fprop_impl``,
``_dgrad_impl``, ``_wgrad_impl``), which take any layout and dtype convgen.torch accepts, and
:class:`FastConv`, one object per call signature that the kernels read as it is (channels_last
float16 or bfloat16 operands), which skips everything a repeat call of that signature would
only re-derive: an eager training loop is host-bound, and PyTorch's own conv dispatch is the
bar (benchmarks/probes/host_cost.py).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

import convgen
from convgen.ir import ConvGeometry

_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # what the kernels read (16-bit) and write
_TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _elem(*dtypes: Optional[torch.dtype]) -> str:
    """A call's 16-bit type, what its kernels' MMAs read: bfloat16 where x or w is bfloat16,
    else float16 (float32 and float64 operands are rounded to it, as autocast would)."""
    return "bfloat16" if torch.bfloat16 in dtypes else "float16"


def _out_dtype(elem: str, *dtypes: Optional[torch.dtype]) -> str:
    """The kernels' output dtype: the call's 16-bit type only when everything it is for has
    that type (wider dtypes get float32 out of the kernel, the exact accumulator, then widen
    if float64)."""
    return elem if all(d in (None, _TORCH[elem]) for d in dtypes) else "float32"


def _dense_half(view: torch.Tensor, elem: str) -> torch.Tensor:
    """``view`` (already in the kernel's logical order: NHWC or KRSC) as a dense tensor of the
    call's 16-bit type ``elem``.

    No copy when it already is one: that is the zero-copy path of a channels_last
    16-bit tensor.  Otherwise one fused cast-and-relayout copy.  Alignment is
    the runtime's job (it copies an operand whose pointer a vector load cannot use).
    """
    dtype = _TORCH[elem]
    if view.dtype == dtype and view.is_contiguous():
        return view
    out = torch.empty(view.shape, dtype=dtype, device=view.device)
    out.copy_(view)
    return out


def _nhwc_half(t: torch.Tensor, elem: str) -> torch.Tensor:
    """(N, C, H, W) logical -> dense (N, H, W, C) of ``elem``; a view of ``t`` if it is channels_last ``elem``."""
    return _dense_half(t.permute(0, 2, 3, 1), elem)


# --------------------------------------------------------------------------- the launch bridge
# Everything convgen.torch hands the kernels goes through these three functions (pointers of
# tensors it made dense itself, PyTorch's current stream, the current device), so CPU tests
# swap them and convgen.prepare for a NumPy bridge and exercise everything else.


def _ptr(t: torch.Tensor) -> int:
    """The device pointer of an operand or output ``t``, which this module made a dense tensor
    of the dtype the kernel reads or writes: a prepared op's :meth:`launch` takes the
    caller's word for shape and dtype, so this guard keeps the word honest."""
    if not t.is_contiguous() or t.dtype not in _KERNEL_DTYPES:
        raise RuntimeError(f"convgen.torch: internal error, a {t.dtype} tensor of strides {t.stride()} "
                           "reached the kernels (they read dense float16 or bfloat16 and write those or float32)")
    return t.data_ptr()


def _raw_stream(index: int) -> int:
    """PyTorch's current stream on device ``index``, as a raw pointer: the launch goes there
    (under graph capture that is the capturing stream).  ``torch._C._cuda_getCurrentRawStream``
    is what Inductor's own generated code calls for this; it skips building a
    ``torch.cuda.Stream`` object (about 2 us).  Older or other builds take the public call."""
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return get(index) if get is not None else torch.cuda.current_stream(index).cuda_stream


def _current_device() -> int:
    return torch.cuda.current_device()


def _launch(op: Any, index: int, a: torch.Tensor, b: torch.Tensor, outs: tuple, bias: Optional[torch.Tensor] = None,
            workspace: Optional[torch.Tensor] = None) -> None:
    """Launch ``op`` on the tensors, on PyTorch's current stream of device ``index``, making
    that device current only if it is not (the common case costs one query)."""
    if _current_device() != index:
        with torch.cuda.device(index):
            return _launch(op, index, a, b, outs, bias, workspace)
    op.launch(_ptr(a), _ptr(b), tuple(_ptr(o) for o in outs), bias=0 if bias is None else _ptr(bias),
              workspace=0 if workspace is None else _ptr(workspace), stream=_raw_stream(index))
    return None


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a copy of it in fresh (aligned) memory when a view starts off a 16-byte
    boundary, which the kernels' vector loads cannot read."""
    return t.clone() if t.data_ptr() % 16 else t


# --------------------------------------------------------------------------- the kernels

# Per layer and pass (shapes, geometry, options, device): the prepared op, so a layer's repeat
# calls cost one dict lookup, the tensors' views and a launch.  Outputs and split-K workspaces
# are PyTorch tensors (PyTorch's caching allocator; under capture, the graph's pool).
_prepared: dict[tuple, Any] = {}


def _op(*key: Any) -> Any:
    """The op of (pass, NHWC x_shape, KRSC w_shape, geometry, bias, out_dtype, device, groups,
    the 16-bit type); KRSC is (K, R, S, C/groups)."""
    op = _prepared.get(key)
    if op is None:
        op = _prepared[key] = convgen.prepare(**_prepare_args(key))
    return op


def _prepare_args(key: tuple) -> dict:  # convgen.prepare's arguments for an op's key
    pass_, x_shape, w_shape, (stride, padding, dilation), bias, out_dtype, device, groups, elem = key
    return dict(pass_=pass_, x_shape=x_shape, w_shape=w_shape, stride=stride, padding=padding, dilation=dilation,
                bias=bool(bias), bias_dtype=bias if isinstance(bias, str) else "float32", out_dtype=out_dtype,
                device=device, groups=groups, in_dtype=elem)


def _bias_key(b_dtype: Optional[torch.dtype], elem: str) -> Any:
    """fprop's bias in an op's key: False, or the dtype the epilogue reads it as (a bias of
    the call's 16-bit type as it is, any other as float32)."""
    if b_dtype is None:
        return False
    return elem if b_dtype == _TORCH[elem] else "float32"


def _kernel_bias(bias: Optional[torch.Tensor], elem: str) -> Optional[torch.Tensor]:
    """The bias as the epilogue reads it (see _bias_key): ``elem`` or float32 as it is, else float32."""
    if bias is None or bias.dtype in (_TORCH[elem], torch.float32):
        return bias
    return bias.to(torch.float32)


def _workspace(op: Any, device: torch.device) -> Optional[torch.Tensor]:
    elems = op.workspace_elems
    return torch.empty(elems, dtype=torch.float32, device=device) if elems else None


def _nchw_empty(shape: tuple, kernel_dtype: str, device: torch.device) -> torch.Tensor:
    """A (N, C, H, W)-logical output in channels_last memory: its NHWC permutation is the
    dense array the kernel writes."""
    return torch.empty(shape, dtype=_TORCH[kernel_dtype], device=device, memory_format=torch.channels_last)


def _device_index(t: torch.Tensor) -> int:
    return _index_of(t.device)


def _index_of(device: torch.device) -> int:
    if device.index is not None:
        return device.index
    return torch.cuda.current_device() if device.type == "cuda" else 0  # (CPU tensors: the CPU tests)


def _geo(stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int]) -> tuple:
    return (tuple(stride), tuple(padding), tuple(dilation))


_out_hw: dict[tuple, tuple[int, int]] = {}


def _output_hw(h: int, w: int, c: int, k: int, r: int, s: int, geo: tuple) -> tuple[int, int]:
    """(P, Q) of a layer, validated by ConvGeometry the first time (it names what is wrong)
    and remembered: building one per call cost more than the launch."""
    key = (h, w, r, s, geo)
    hw = _out_hw.get(key)
    if hw is None:
        g = ConvGeometry(h, w, c, k, r, s, *geo)
        hw = _out_hw[key] = (g.p, g.q)
    return hw


def _fprop_impl(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], stride: Sequence[int],
                padding: Sequence[int], dilation: Sequence[int], groups: int = 1) -> torch.Tensor:
    n, c, h, wd = x.shape
    k, cw, r, s = w.shape  # cw = C/groups
    geo = _geo(stride, padding, dilation)
    p, q = _output_hw(h, wd, c, k, r, s, geo)
    elem = _elem(x.dtype, w.dtype)
    out_dtype = _out_dtype(elem, x.dtype)
    y = _nchw_empty((n, k, p, q), out_dtype, x.device)
    if n == 0:  # nothing to launch
        return y if y.dtype == x.dtype else y.to(x.dtype)
    index = _device_index(x)
    b_key = _bias_key(None if bias is None else bias.dtype, elem)
    op = _op("fprop", (n, h, wd, c), (k, r, s, cw), geo, b_key, out_dtype, index, groups, elem)
    x16 = _aligned(_nhwc_half(x, elem))
    w16 = _aligned(_dense_half(w.permute(0, 2, 3, 1), elem))  # KRSC
    b = _kernel_bias(bias, elem)
    b = None if b is None else _aligned(b.contiguous())
    _launch(op, index, x16, w16, (y.permute(0, 2, 3, 1),), b, _workspace(op, x.device))
    return y if y.dtype == x.dtype else y.to(x.dtype)


def _dgrad_impl(gy: torch.Tensor, w: torch.Tensor, x_shape: Sequence[int], x_dtype: torch.dtype,
                stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
                groups: int = 1) -> torch.Tensor:
    n, c, h, wd = x_shape
    k, cw, r, s = w.shape
    geo = _geo(stride, padding, dilation)
    elem = _elem(x_dtype, w.dtype)
    out_dtype = _out_dtype(elem, x_dtype)
    dx = _nchw_empty((n, c, h, wd), out_dtype, gy.device)
    if n:
        index = _device_index(gy)
        op = _op("dgrad", (n, h, wd, c), (k, r, s, cw), geo, False, out_dtype, index, groups, elem)
        gy16 = _aligned(_nhwc_half(gy, elem))  # dense NHWC 16-bit dy (a view when gy is channels_last of it)
        w16 = _aligned(_dense_half(w.permute(0, 2, 3, 1), elem))
        _launch(op, index, gy16, w16, (dx.permute(0, 2, 3, 1),), None, _workspace(op, gy.device))
    return dx if dx.dtype == x_dtype else dx.to(x_dtype)


def _wgrad_impl(gy: torch.Tensor, x: torch.Tensor, w_shape: Sequence[int], w_dtype: torch.dtype,
                b_dtype: Optional[torch.dtype], stride: Sequence[int], padding: Sequence[int],
                dilation: Sequence[int], groups: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    n, c, h, wd = x.shape
    k, cw, r, s = w_shape  # cw = C/groups
    geo = _geo(stride, padding, dilation)
    elem = _elem(x.dtype, w_dtype)
    out_dtype = _out_dtype(elem, w_dtype, b_dtype)
    dw = _nchw_empty((k, cw, r, s), out_dtype, x.device)  # KRSC memory, (K, C/groups, R, S) logical
    db = torch.empty((k,) if b_dtype is not None else (0,), dtype=dw.dtype, device=x.device)
    if n == 0:  # an empty batch contributes nothing: the gradients are exactly zero
        dw.zero_()
        db.zero_()
    else:
        index = _device_index(x)
        op = _op("wgrad", (n, h, wd, c), (k, r, s, cw), geo, b_dtype is not None, out_dtype, index, groups, elem)
        gy16 = _aligned(_nhwc_half(gy, elem))
        x16 = _aligned(_nhwc_half(x, elem))
        _launch(op, index, x16, gy16, (dw.permute(0, 2, 3, 1),) + ((db,) if b_dtype is not None else ()), None,
                _workspace(op, x.device))
    return (dw if dw.dtype == w_dtype else dw.to(w_dtype),
            db if b_dtype is None or db.dtype == b_dtype else db.to(b_dtype))



# --------------------------------------------------------------------------- the fast path


def _cl_ptr(t: torch.Tensor) -> int:
    """The device pointer of a (N, C, H, W)-logical tensor in dense channels_last memory,
    which is the NHWC (or KRSC) array the kernels read and write.  Only for tensors whose
    call signature (:func:`signature`) said so: a FastConv checked it when it was built."""
    return t.data_ptr()


def _cl_strides(shape: Sequence[int]) -> tuple[int, int, int, int]:
    """The strides of a dense channels_last tensor of logical shape (N, C, H, W)."""
    _, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def _is_cl(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether a tensor of this shape and stride is dense channels_last memory.  A size-1
    dimension's stride is never used (PyTorch reports a (K, C, 1, 1) weight's as 1s)."""
    return all(n == 1 or st == want for n, st, want in zip(shape, stride, _cl_strides(shape)))


def signature(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], *geometry: Any) -> tuple:
    """What a FastConv is kept under: everything about the operands that decides what the
    kernels are handed (shapes, strides, dtypes, devices) and conv2d's geometry arguments as
    given (groups among them: the same shapes under another groups are another call).
    Raises TypeError when those arguments are unhashable (lists): no fast path."""
    b = None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.device)
    return (x.shape, x.stride(), x.dtype, x.device, w.shape, w.stride(), w.dtype, b, geometry)


class FastConv:
    """The three passes of one call signature whose operands the kernels read as they are:
    x and w channels_last float16 (or both bfloat16), bias absent or a dense vector of that
    type or float32, a
    non-empty batch and symmetric padding.  Everything a call would re-derive (checks,
    geometry, the ops, output shapes and strides) is fixed here once; a call allocates its
    output, takes the pointers and launches.  Anything off that path (another device
    current, a misaligned view, a gradient of another layout) takes the implementations."""

    def __init__(self, x_shape: Sequence[int], w_shape: Sequence[int], dtype: torch.dtype, device: torch.device,
                 b_dtype: Optional[torch.dtype], stride: Sequence[int], padding: Sequence[int],
                 dilation: Sequence[int], groups: int = 1) -> None:
        """From metadata alone (shapes in torch's logical order, the operands' 16-bit dtype, the
        bias's dtype or None): the backward operators know x or w only by its shape."""
        n, c, h, wd = x_shape
        k, cw, r, s = w_shape  # cw = C/groups
        self.geo = _geo(stride, padding, dilation)
        self.groups = groups
        self.geo_lists = (list(stride), list(padding), list(dilation), groups)  # what the implementations take
        p, q = _output_hw(h, wd, c, k, r, s, self.geo)
        self.index = _index_of(device)
        self.device = device
        self.x_shape, self.w_shape, self.y_shape = (n, c, h, wd), (k, cw, r, s), (n, k, p, q)
        # the outputs' dense channels_last strides, for torch.empty_strided (0.6 us a call cheaper
        # than torch.empty(memory_format=...) on the CPU machine; the same tensors)
        self._x_strides, self._w_strides, self._y_strides = (_cl_strides(t) for t in (self.x_shape, self.w_shape,
                                                                                       self.y_shape))
        self._gy_strides = {_cl_strides(self.y_shape)}  # strides of gradients met that are dense channels_last
        self.b_dtype = b_dtype
        self.dtype = dtype  # the call's 16-bit type: its operands', outputs' and gradients'
        self.elem = _elem(dtype)
        self._shapes = ((n, h, wd, c), (k, r, s, cw))
        self._fprop_bias = _bias_key(b_dtype, self.elem)
        self._ops: dict[tuple, Any] = {}  # (pass, bias) -> its prepared op, built on first use

    @classmethod
    def of(cls, x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], stride: Sequence[int],
           padding: Sequence[int], dilation: Sequence[int], groups: int = 1) -> "FastConv":
        """The FastConv of a call's operands (which :meth:`fits` accepted)."""
        return cls(x.shape, w.shape, x.dtype, x.device, None if bias is None else bias.dtype, stride, padding,
                   dilation, groups)

    @staticmethod
    def fits(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor]) -> bool:
        """Whether the kernels read these operands as they are (so a FastConv serves them)."""
        return (x.dtype in (torch.float16, torch.bfloat16) and w.dtype == x.dtype and x.shape[0] > 0
                and _is_cl(x.shape, x.stride()) and _is_cl(w.shape, w.stride())
                and (bias is None or (bias.dtype in (x.dtype, torch.float32) and bias.is_contiguous())))

    def _here(self) -> bool:
        return _current_device() == self.index

    def __call__(self, x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """y = conv(x, w) [+ bias], (N, K, P, Q) in channels_last memory of x's 16-bit type."""
        xp, wp = _cl_ptr(x), _cl_ptr(w)
        bp = 0 if bias is None else _ptr(bias)  # x's type or float32 (fits()): the epilogue reads it as it is
        if (xp | wp | bp) & 15 or not self._here():
            return _fprop_impl(x, w, bias, *self.geo_lists)
        y = torch.empty_strided(self.y_shape, self._y_strides, dtype=self.dtype, device=self.device)
        op = self._op("fprop", self._fprop_bias)
        ws = _workspace(op, self.device)
        op.launch(xp, wp, (_cl_ptr(y),), bias=bp, workspace=0 if ws is None else _ptr(ws),
                  stream=_raw_stream(self.index))
        return y

    def _op(self, pass_: str, bias: Any) -> Any:
        """The prepared op of a pass (``bias`` as an op's key has it), built on its first use:
        a backward operator's FastConv never builds fprop's."""
        op = self._ops.get((pass_, bias))
        if op is None:
            op = self._ops[(pass_, bias)] = _op(pass_, *self._shapes, self.geo, bias, self.elem, self.index,
                                                self.groups, self.elem)
        return op

    def grads(self, gy: torch.Tensor, x: Optional[torch.Tensor], w: Optional[torch.Tensor],
              needs: Sequence[bool]) -> Optional[tuple]:
        """(dx, dw, db) as autograd asks for them (None where not asked), or None when gy is
        not what the kernels read as it is (the caller then takes the implementations)."""
        need_dx, need_dw, need_db = needs
        if (gy.dtype != self.dtype or gy.shape != self.y_shape
                or (need_dw and need_db and self.b_dtype != self.dtype) or not self._here()):
            return None
        if gy.stride() not in self._gy_strides:
            if not _is_cl(gy.shape, gy.stride()):
                return None
            self._gy_strides.add(gy.stride())
        gyp = _cl_ptr(gy)
        xp = _cl_ptr(x) if need_dw and x is not None else 0
        wp = _cl_ptr(w) if need_dx and w is not None else 0
        if (gyp | xp | wp) & 15:
            return None
        stream = _raw_stream(self.index)
        dx = dw = db = None
        if need_dx:
            op = self._op("dgrad", False)
            dx = torch.empty_strided(self.x_shape, self._x_strides, dtype=self.dtype, device=self.device)
            ws = _workspace(op, self.device)
            op.launch(gyp, wp, (_cl_ptr(dx),), workspace=0 if ws is None else _ptr(ws), stream=stream)
        if need_dw:
            op = self._op("wgrad", need_db)
            dw = torch.empty_strided(self.w_shape, self._w_strides, dtype=self.dtype, device=self.device)
            outs: tuple = (_cl_ptr(dw),)
            if need_db:
                db = torch.empty((self.w_shape[0],), dtype=self.dtype, device=self.device)
                outs += (_ptr(db),)
            ws = _workspace(op, self.device)
            op.launch(xp, gyp, outs, workspace=0 if ws is None else _ptr(ws), stream=stream)
        elif need_db:  # only the bias trains: a plain reduction of dy, not worth a wgrad launch
            db = gy.sum(dim=(0, 2, 3), dtype=torch.float32).to(self.b_dtype)
        return dx, dw, db


# Per call signature (see signature()): its FastConv.  Filled by convgen.torch's first call
# of a signature, after that call's checks passed.
fast_calls: dict[tuple, FastConv] = {}


# --------------------------------------------------------------------------- the operators' fast path
# torch.compile's graphs call the registered operators on every step that CUDA graphs do not
# capture, with operands that are usually channels_last 16-bit tensors: the operators take a
# FastConv too, kept under each call's own signature (their geometry comes as lists).  None
# is kept for a signature the kernels cannot read as it is, so its repeat calls go straight
# to the implementations.

operator_calls: dict[tuple, Optional[FastConv]] = {}
_HALF = (torch.float16, torch.bfloat16)


def operator_fprop(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], stride: Sequence[int],
                   padding: Sequence[int], dilation: Sequence[int], groups: int) -> Optional[FastConv]:
    """The FastConv serving ``convgen::conv2d`` on these operands, or None."""
    key = signature(x, w, bias, *stride, *padding, *dilation, groups)
    try:
        return operator_calls[key]
    except KeyError:
        fast = FastConv.of(x, w, bias, stride, padding, dilation, groups) if FastConv.fits(x, w, bias) else None
        operator_calls[key] = fast
        return fast


def operator_dgrad(gy: torch.Tensor, w: torch.Tensor, x_shape: Sequence[int], x_dtype: torch.dtype,
                   stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
                   groups: int) -> Optional[FastConv]:
    """The FastConv serving ``convgen::conv2d_dgrad`` on these operands, or None: dy and w of
    one 16-bit type, which is x's, w channels_last (dy's layout :meth:`FastConv.grads` checks)."""
    key = ("dgrad", gy.dtype, gy.device, w.shape, w.stride(), w.dtype, *x_shape, x_dtype, *stride, *padding,
           *dilation, groups)
    try:
        return operator_calls[key]
    except KeyError:
        fits = (gy.dtype in _HALF and w.dtype == gy.dtype and x_dtype == gy.dtype and x_shape[0] > 0
                and _is_cl(w.shape, w.stride()))
        fast = FastConv(x_shape, w.shape, gy.dtype, gy.device, None, stride, padding, dilation, groups) if fits else None
        operator_calls[key] = fast
        return fast


def operator_wgrad(gy: torch.Tensor, x: torch.Tensor, w_shape: Sequence[int], w_dtype: torch.dtype,
                   b_dtype: Optional[torch.dtype], stride: Sequence[int], padding: Sequence[int],
                   dilation: Sequence[int], groups: int) -> Optional[FastConv]:
    """The FastConv serving ``convgen::conv2d_wgrad`` on these operands, or None: dy, x, dW
    (and db, when asked for) of one 16-bit type, x channels_last."""
    key = ("wgrad", gy.dtype, x.shape, x.stride(), x.dtype, x.device, *w_shape, w_dtype, b_dtype, *stride,
           *padding, *dilation, groups)
    try:
        return operator_calls[key]
    except KeyError:
        fits = (x.dtype in _HALF and gy.dtype == x.dtype and w_dtype == x.dtype and b_dtype in (None, x.dtype)
                and x.shape[0] > 0 and _is_cl(x.shape, x.stride()))
        fast = FastConv(x.shape, w_shape, x.dtype, x.device, b_dtype, stride, padding, dilation, groups) if fits else None
        operator_calls[key] = fast
        return fast
