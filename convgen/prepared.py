"""Prepared convolutions: a pass, a shape and its options bound once, so a call launches.

A framework calls one layer's three passes thousands of times a second with the same
shapes.  ``convgen.conv2d`` and friends re-derive everything each call could need
(argument checks, dtype casts, output and workspace allocation), and on small layers that
Python costs more than the kernel.  :func:`prepare` does the derivation once: it plans,
compiles and loads the kernel, fixes the grid and the argument order, and returns an op
whose ``__call__`` only checks that each array is the one the kernel was built for (shape,
dtype, strides, device, alignment: a few attribute reads) and launches.  Anything else (a
strided view, an fp32 array where fp16 is read, a misaligned pointer) takes the plain
function's path through :func:`convgen.runtime._operand`, so a prepared op is never wrong
where the plain function is right, only faster where the arrays are as expected.

Launches go through the CUDA driver's ``cuLaunchKernel`` when NVIDIA's ``cuda-bindings``
package is importable (``pip install cuda-bindings``; CuPy does not bring it), with the
kernel's parameter block packed once per op and only the pointers rewritten per call: that
skips CuPy's per-argument dispatch, which is most of a CuPy launch's host cost.  Without
``cuda-bindings`` (or with ``CONVGEN_LAUNCH=cupy``) the op launches through CuPy's
``Function``, as the plain functions do.  Both put the kernel on CuPy's current stream.

Split-K workspaces come from a per-(device, stream) arena that only grows.  Work on one
stream runs in order, so one buffer serves every op of that stream; a buffer that is
outgrown is kept alive too, so a CUDA graph captured with it stays valid.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Optional

import numpy as np

from . import runtime as _rt
from .ir import ConvProblem, Epilogue, Pass, PairLike, Plan

_F16 = np.dtype("float16")
_F32 = np.dtype("float32")


def _contiguous_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))


class _Arena:
    """Split-K workspaces per (device, stream): one growing fp32 buffer each."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[int, int], Any] = {}
        self._outgrown: list[Any] = []  # kept alive: a captured graph may still read them
        self._lock = threading.Lock()

    def get(self, device: int, stream: int, elems: int) -> Any:
        buf = self._buffers.get((device, stream))
        if buf is not None and buf.size >= elems:
            return buf
        cupy = _rt._cupy()
        with self._lock:
            buf = self._buffers.get((device, stream))
            if buf is None or buf.size < elems:
                if buf is not None:
                    self._outgrown.append(buf)
                buf = self._buffers[(device, stream)] = cupy.empty(max(elems, 1), dtype=np.float32)
        return buf


_ARENA = _Arena()


def _driver() -> Any:
    """cuda-bindings' driver module, or None when it is absent or CONVGEN_LAUNCH=cupy."""
    if os.environ.get("CONVGEN_LAUNCH", "").lower() == "cupy":
        return None
    try:
        from cuda.bindings import driver
    except ImportError:
        return None
    return driver


class _Launcher:
    """One kernel's launch with a fixed grid, block and shared memory.

    ``slots`` holds one 8-byte cell per kernel parameter (pointers, and int32/int64
    scalars in the low bytes, little-endian), ``params`` the cells' addresses: the
    ``void**`` that cuLaunchKernel reads.  The driver copies the parameters at launch, so
    the cells may be rewritten for the next call as soon as the launch returns.
    """

    def __init__(self, fn: Any, grid: tuple[int, int, int], block: tuple[int, int, int], shared_mem: int,
                 args: tuple[str, ...], driver: Any) -> None:
        self.fn, self.grid, self.block, self.shared_mem, self.names = fn, grid, block, shared_mem, args
        self.driver = driver
        self.slots = np.zeros(max(len(args), 1), dtype=np.uint64)
        self.params = np.array([self.slots.ctypes.data + 8 * i for i in range(len(args))] or [0], dtype=np.uint64)
        self.params_ptr = int(self.params.ctypes.data)
        self.fn_ptr = int(fn.ptr)
        self.lock = threading.Lock()

    def launch(self, values: tuple[Any, ...], stream_ptr: int) -> None:
        """``values``: device pointers (ints, 0 for none) and ints, in argument order."""
        if self.driver is None:
            raise AssertionError("launch() needs the driver path")
        gx, gy, gz = self.grid
        bx, by, bz = self.block
        with self.lock:
            self.slots[: len(values)] = values
            err, = self.driver.cuLaunchKernel(self.fn_ptr, gx, gy, gz, bx, by, bz, self.shared_mem,
                                              stream_ptr, self.params_ptr, 0)
        if err != 0:
            raise RuntimeError(f"cuLaunchKernel failed for {self.names}: {err!r}")


class PreparedConv:
    """One pass of one conv2d shape, ready to launch: see :func:`prepare`."""

    def __init__(self, pass_: Pass, problem: ConvProblem, epilogue: Epilogue, in_dtype: str, device: int,
                 plan: Optional[Plan]) -> None:
        self.pass_, self.problem, self.epilogue, self.device = pass_, problem, epilogue, device
        self.in_dtype = in_dtype
        self.out_dtype = np.dtype(epilogue.out_dtype)
        p = problem
        # (name, shape) of the array operands, in the order __call__ takes them
        if pass_ is Pass.FPROP:
            self._inputs = (("x", p.x_shape), ("w", p.w_shape))
            self.out_shapes: tuple[tuple[int, ...], ...] = (p.y_shape,)
        elif pass_ is Pass.DGRAD:
            self._inputs = (("dy", p.y_shape), ("w", p.w_shape))
            self.out_shapes = (p.x_shape,)
        else:
            self._inputs = (("x", p.x_shape), ("dy", p.y_shape))
            self.out_shapes = (p.w_shape,) + (((p.k,),) if epilogue.bias else ())
        self._kernel = None if p.n == 0 else _rt._kernel(p, pass_, epilogue, in_dtype, device, plan, False)
        if self._kernel is None:
            return
        src = self._kernel.source
        splan = src.spec.plan
        # read dtype and vector width per input, by name (fprop/dgrad: A then B; wgrad: dy is A)
        reads = {"x": (splan.read_a, splan.vec_a), "dy": (splan.read_a, splan.vec_a), "w": (splan.read_b, splan.vec_b)}
        if pass_ is Pass.WGRAD:
            reads["x"] = (splan.read_b, splan.vec_b)
        self._expect = tuple(
            (name, shape, np.dtype(reads[name][0]), _contiguous_strides(shape, np.dtype(reads[name][0]).itemsize),
             reads[name][1] * np.dtype(reads[name][0]).itemsize, reads[name][0])
            for name, shape in self._inputs
        )
        self._reads = reads
        batch = p.n
        self._batch = batch
        drv = _driver()
        self._main = _Launcher(self._kernel.main, src.grid(batch), src.main.block, src.main.shared_mem,
                               src.main.args, drv)
        self._reduce = None
        # dw's (or y's, dx's) fp32 slices, then db's, 16-byte aligned, in one arena buffer
        self._ws_elems = -(-src.workspace_elems(batch) // 4) * 4
        self._db_ws_elems = src.main.grid_z * p.k if src.reduce is not None and "db" in src.reduce.args else 0
        self._ws_buf: Any = None
        self._ws_views: tuple[Any, Any] = (None, None)
        if src.reduce is not None:
            self._reduce = _Launcher(self._kernel.reduce, (src.reduce.grid_x(batch), 1, 1), src.reduce.block, 0,
                                     src.reduce.args, drv)
        self._m_rows = self._kernel.gemm_m(batch)

    # -- the call ------------------------------------------------------------
    def _input(self, name: str, a: Any, shape: tuple, dtype: Any, strides: tuple, align: int, read: str) -> Any:
        """`a` itself when the kernel reads it as it is, else the plain path's copy; the
        full checks (naming the argument) run only off the fast path."""
        try:
            mem = a.data
            if (a.shape == shape and a.dtype == dtype and a.strides == strides and mem.ptr % align == 0
                    and mem.device_id == self.device):
                return a
        except AttributeError:
            pass
        _rt._check_array(name, a, len(shape))
        if a.shape != shape:
            raise ValueError(f"{name} has shape {a.shape}; this prepared {self.pass_.value} was built for {shape}")
        if a.data.device_id != self.device:
            raise ValueError(f"{name} is on device {a.data.device_id}; this op was built for device {self.device}")
        return _rt._operand(name, a, read, self._reads[name][1])

    def _output(self, name: str, out: Any, shape: tuple) -> Any:
        if out is None:
            return _rt._empty(shape, self.out_dtype)
        cupy = _rt._cupy()
        if not isinstance(out, cupy.ndarray):
            raise TypeError(f"{name} must be a cupy.ndarray, got {type(out).__name__}")
        if (out.shape != shape or out.dtype != self.out_dtype
                or out.strides != _contiguous_strides(shape, self.out_dtype.itemsize) or out.data.ptr % 16):
            raise ValueError(f"{name} must be a C-contiguous, 16-byte aligned {self.out_dtype.name} array of shape "
                             f"{shape}, got {out.dtype.name} {out.shape} with strides {out.strides}")
        if out.data.device_id != self.device:
            raise ValueError(f"{name} is on device {out.data.device_id}; this op runs on device {self.device}")
        return out

    @property
    def workspace_elems(self) -> int:
        """fp32 elements of split-K workspace a call needs (0 without split-K): the size of
        a caller-supplied ``workspace``."""
        return 0 if self._kernel is None else self._ws_elems + self._db_ws_elems

    def __call__(self, a: Any, b: Any, bias: Any = None, *, out: Any = None, workspace: Any = None) -> Any:
        """fprop: ``op(x, w[, bias], out=y)`` -> y.  dgrad: ``op(dy, w, out=dx)`` -> dx.
        wgrad: ``op(x, dy, out=(dw, db))`` -> (dw, db) (db None without bias).

        ``workspace``: an fp32 CuPy array of at least :attr:`workspace_elems` elements that
        the call may overwrite, instead of the stream's arena buffer (a framework that owns
        its memory, or a graph capture with its own pool, passes one)."""
        cupy = _rt._cupy()
        outs = out if isinstance(out, tuple) else (out,) + (None,) * (len(self.out_shapes) - 1)
        if len(outs) != len(self.out_shapes):
            raise ValueError(f"out must hold {len(self.out_shapes)} arrays for this {self.pass_.value}, got {len(outs)}")
        if self._kernel is None:  # an empty batch: no output element, and zero gradients
            res = [self._output(n, o, s) for n, o, s in zip(("out", "out[1]"), outs, self.out_shapes)]
            for r in res:
                r.fill(0)
            return self._result(res)
        if (bias is not None) != (self.pass_ is Pass.FPROP and self.epilogue.bias):
            raise ValueError("bias: this prepared op was built " + ("with" if self.epilogue.bias else "without")
                             + " a bias" + ("" if self.pass_ is Pass.FPROP else f"; {self.pass_.value} takes none"))
        switch = cupy.cuda.runtime.getDevice() != self.device
        if switch:
            ctx = cupy.cuda.Device(self.device)
            ctx.__enter__()
        try:
            (na, sa, da, ta, la, ra), (nb, sb, db_, tb, lb, rb) = self._expect
            a = self._input(na, a, sa, da, ta, la, ra)
            b = self._input(nb, b, sb, db_, tb, lb, rb)
            res = [self._output(n, o, s) for n, o, s in zip(("out", "out[1]"), outs, self.out_shapes)]
            args: dict[str, Any] = {"batch": self._batch}
            if self.pass_ is Pass.FPROP:
                args.update(x=a, w=b, y=res[0])
                if bias is not None:
                    args["bias"] = _rt._operand("bias", bias, "float32", 4)
            elif self.pass_ is Pass.DGRAD:
                args.update(dy=a, w=b, dx=res[0])
            else:
                args.update(x=a, dy=b, dw=res[0], db=res[1] if len(res) > 1 else None)
            self._launch(args, workspace)
        finally:
            if switch:
                ctx.__exit__(None, None, None)
        return self._result(res)

    def _result(self, res: list) -> Any:
        if self.pass_ is Pass.WGRAD:
            return (res[0], res[1] if len(res) > 1 else None)
        return res[0]

    def _launch(self, args: dict[str, Any], workspace: Any) -> None:
        cupy = _rt._cupy()
        stream = cupy.cuda.get_current_stream()
        if self._ws_elems:
            if workspace is not None:
                _check_workspace(workspace, self._ws_elems + self._db_ws_elems, self.device)
            buf = workspace if workspace is not None else _ARENA.get(self.device, stream.ptr,
                                                                     self._ws_elems + self._db_ws_elems)
            if buf is not self._ws_buf:  # views of a new buffer, made once per buffer
                self._ws_buf = buf
                self._ws_views = (buf, buf[self._ws_elems:] if self._db_ws_elems else None)
            args["workspace"], args["db_workspace"] = self._ws_views
        else:
            args["workspace"] = None
            args.setdefault("db_workspace", None)
        args["m_rows"] = self._m_rows
        for launcher in (self._main, self._reduce):
            if launcher is None:
                continue
            if launcher.driver is not None:
                launcher.launch(tuple(_value(args[n]) for n in launcher.names), stream.ptr)
            else:
                launcher.fn(launcher.grid, launcher.block, tuple(_cupy_arg(n, args[n]) for n in launcher.names),
                            shared_mem=launcher.shared_mem)


def _check_workspace(ws: Any, elems: int, device: int) -> None:
    cupy = _rt._cupy()
    if (not isinstance(ws, cupy.ndarray) or ws.dtype != _F32 or ws.ndim != 1 or ws.size < elems
            or ws.strides != (4,) or ws.data.ptr % 16 or ws.data.device_id != device):
        raise ValueError(f"workspace must be a contiguous, 16-byte aligned 1-D float32 array of at least {elems} "
                         f"elements on device {device}, got {getattr(ws, 'dtype', type(ws).__name__)} "
                         f"{getattr(ws, 'shape', '')}")


def _value(v: Any) -> int:
    """A kernel parameter as the 8-byte cell holds it: a device pointer or an integer."""
    if v is None:
        return 0
    if isinstance(v, int):
        return v
    return v.data.ptr


def _cupy_arg(name: str, v: Any) -> Any:
    if name == "batch":
        return np.int32(v)
    if name == "m_rows":
        return np.int64(v)
    return v


def prepare(
    pass_: Pass | str, x_shape: tuple[int, int, int, int], w_shape: tuple[int, int, int, int], *,
    stride: PairLike = 1, padding: PairLike | str = 0, dilation: PairLike = 1, bias: bool = False,
    activation: Optional[str] = None, in_dtype: Any = "float16", out_dtype: Any = "float16",
    device: Optional[int] = None, plan: Optional[Plan] = None,
) -> PreparedConv:
    """Bind one pass of one conv2d (NHWC ``x_shape``, KRSC ``w_shape``) and its options.

    fprop takes ``bias`` (the op then wants a bias array) and ``activation`` (None or
    "relu"); wgrad's ``bias`` makes it return db too.  ``in_dtype`` is the dtype the op's
    inputs will have (float16, or float32 to let the plan read it in the gather).  The op
    runs on ``device`` (default: CuPy's current device).
    """
    p = Pass.parse(pass_)
    for name, shape in (("x_shape", x_shape), ("w_shape", w_shape)):
        if not isinstance(shape, (tuple, list)) or len(shape) != 4:
            raise ValueError(f"{name} must be a 4-tuple ({'N, H, W, C' if name == 'x_shape' else 'K, R, S, C'}), "
                             f"got {shape!r}")
    n, h, w, c = x_shape
    k, r, s, wc = w_shape
    if wc != c:
        raise ValueError(f"w_shape has {wc} input channels (w_shape[3]) but x_shape has {c} (x_shape[3])")
    if activation not in (None, "relu"):
        raise ValueError(f"activation must be None or 'relu', got {activation!r}")
    if activation is not None and p is not Pass.FPROP:
        raise ValueError(f"activation is an fprop epilogue; {p.value} cannot apply it")
    if bias and p is Pass.DGRAD:
        raise ValueError("bias does not apply to dgrad (dx does not depend on the bias)")
    in_name = np.dtype(in_dtype).name if isinstance(in_dtype, (str, np.dtype, type)) else None
    if in_name not in ("float16", "float32"):
        raise ValueError(f"in_dtype must be float16 or float32, got {in_dtype!r}")
    problem = _rt._problem(n, h, w, c, k, r, s, stride, padding, dilation)
    epi = Epilogue(bias=bool(bias), relu=activation == "relu", out_dtype=_rt._out_dtype(out_dtype))  # type: ignore[arg-type]
    cupy = _rt._cupy()
    dev = cupy.cuda.runtime.getDevice() if device is None else int(device)
    return PreparedConv(p, problem, epi, in_name, dev, plan)
