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

Launches go through CuPy's ``Function`` on CuPy's current stream.  Calling the driver's
``cuLaunchKernel`` directly (through cuda-bindings, or ctypes into libcuda, with the
parameter block packed once per op) was measured on the H200 machine and saved nothing:
an empty kernel took 6.1 us of host time through CuPy, 6.6 through cuda-bindings and 7.4
through ctypes, and prepared calls cost the same on all three within the run's noise
(benchmarks/probes/host_cost.py; benchmarks/NOTES.md).

Split-K workspaces come from a per-(device, stream) arena that only grows.  Work on one
stream runs in order, so one buffer serves every op of that stream; a buffer that is
outgrown is kept alive too, so a CUDA graph captured with it stays valid.
"""

from __future__ import annotations

import dataclasses
import operator
import threading
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from . import runtime as _rt
from .channel_pad import ChannelPad
from .group_pack import GroupPack
from .footprint import drain_group
from .mainloop import FRAG
from .dtypes import BF16_HINT, check_dtypes, dtype_name, np_dtype, resolve_mma_dtype
from .ir import ConvProblem, Epilogue, Pass, PairLike
from .spec import Plan

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


# The values a launch may pass, by slot: the two inputs, bias, the two outputs, the two
# workspaces, the batch (int32), the reduction's row count (int64), fprop's residual scales
# alpha and beta (float32) and its residual, then a TMA kernel's tensor maps of the two
# inputs and, where the copy engine stores it (TmaWgmma.tma_store), of the output (convgen/tma.py).
_SLOT = {"a": 0, "b": 1, "bias": 2, "out0": 3, "out1": 4, "workspace": 5, "db_workspace": 6, "batch": 7, "m_rows": 8,
         "alpha": 9, "beta": 10, "residual": 11, "a_map": 12, "b_map": 13, "out_map": 14}
_ARG_SLOT = {
    Pass.FPROP: {"x": "a", "w": "b", "bias": "bias", "y": "out0", "x_map": "a_map", "w_map": "b_map", "y_map": "out_map"},
    Pass.DGRAD: {"dy": "a", "w": "b", "dx": "out0", "dy_map": "a_map", "w_map": "b_map", "dx_map": "out_map"},
    Pass.WGRAD: {"x": "a", "dy": "b", "dw": "out0", "db": "out1", "x_map": "a_map", "dy_map": "b_map"},
}


class _Launcher:
    """One kernel's launch through CuPy's Function, with a fixed grid, block and shared
    memory and its arguments picked from a call's slots by one precomputed itemgetter.
    A cooperative one goes through cuLaunchCooperativeKernel (its blocks all resident)."""

    def __init__(self, fn: Any, grid: tuple[int, int, int], block: tuple[int, int, int], shared_mem: int,
                 args: tuple[str, ...], pass_: Pass, cooperative: bool = False) -> None:
        self.fn, self.grid, self.block, self.shared_mem = fn, grid, block, shared_mem
        self.cooperative = cooperative
        slots = [_SLOT[_ARG_SLOT[pass_].get(name, name)] for name in args]
        self.pick = operator.itemgetter(*slots) if len(slots) > 1 else (lambda v, _i=slots[0]: (v[_i],))

    def launch(self, objs: list, stream: Any = None) -> None:
        if self.cooperative:
            self.fn(self.grid, self.block, self.pick(objs), self.shared_mem, stream, True)
        else:  # positional: CuPy's keyword parsing costs a call a few hundred nanoseconds
            self.fn(self.grid, self.block, self.pick(objs), self.shared_mem, stream)


class _Stream:
    """A raw stream pointer as CuPy's launch takes it (anything with ``.ptr``), one per
    pointer, so a call never builds a CuPy Stream object."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


_STREAMS: dict[int, _Stream] = {}
_U64 = np.uint64
# Device pointers as the kernels' 64-bit arguments, made once per address: a framework's buffers
# come back call after call, and building a NumPy scalar costs a launch 175 ns (the CPU box).
_PTRS: dict[int, Any] = {}


def _ptr(p: int) -> Any:
    v = _PTRS.get(p)
    if v is None:
        if len(_PTRS) >= 4096:  # addresses seen once, by the thousand: start over
            _PTRS.clear()
        v = _PTRS[p] = _U64(p)
    return v


class PreparedConv:
    """One pass of one conv2d shape, ready to launch: see :func:`prepare`."""

    def __init__(self, pass_: Pass, problem: ConvProblem, epilogue: Epilogue, in_dtype: str, device: int,
                 plan: Optional[Plan], scalar: bool = False, alpha: float = 1.0, beta: float = 1.0,
                 mma_dtype: Optional[str] = None) -> None:
        self.pass_, self.problem, self.epilogue, self.device = pass_, problem, epilogue, device
        self.in_dtype = in_dtype
        self.mma_dtype = resolve_mma_dtype(in_dtype, mma_dtype)
        self.out_dtype = np_dtype(epilogue.out_dtype)
        p = problem
        if pass_ is Pass.FPROP:
            inputs = (("x", p.x_shape), ("w", p.w_shape))
            self.out_shapes: tuple[tuple[int, ...], ...] = (p.y_shape,)
        elif pass_ is Pass.DGRAD:
            inputs = (("dy", p.y_shape), ("w", p.w_shape))
            self.out_shapes = (p.x_shape,)
        else:
            inputs = (("x", p.x_shape), ("dy", p.y_shape))
            self.out_shapes = (p.w_shape,) + (((p.k,),) if epilogue.bias else ())
        self._out_strides = tuple(_contiguous_strides(s, self.out_dtype.itemsize) for s in self.out_shapes)
        self._n_out = len(self.out_shapes)
        self._bias = pass_ is Pass.FPROP and epilogue.bias
        self._bias_vec = 16 // np_dtype(epilogue.bias_dtype).itemsize  # elements of a 16-byte-aligned pointer
        # The kernel's problem may differ from the op's: an RGB stem's 3 channels padded to 4, so
        # the kernel gathers 8-byte runs (convgen/channel_pad.py), or narrow groups packed into
        # slabs (convgen/group_pack.py); copies before (and for wgrad after) the kernel bridge them.
        self._kernel = None if p.n == 0 else _rt._kernel(p, pass_, epilogue, in_dtype, device, plan, scalar,
                                                         self.mma_dtype)
        kg = p.geometry if self._kernel is None else self._kernel.source.spec.geometry
        cpad = kg.c if kg.c != p.c else None
        # wgrad's kernel writes packed groups' dW as it is (KernelSpec.pack): no copy after it
        slabs = kg.groups if kg.groups != p.groups and pass_ is not Pass.WGRAD else None
        kp = dataclasses.replace(p, c=kg.c, groups=kg.groups)
        self._ws_elems = self._db_ws_elems = self._pad_at = 0
        self._copies: Optional[ChannelPad | GroupPack] = None
        self._arena_buf: Any = None
        if self._kernel is None:
            return
        src = self._kernel.source
        splan = src.spec.plan
        # what the kernel reads for each input: (dtype, vector width); wgrad's A operand is dy
        reads = {"x": (splan.read_a, splan.vec_a), "dy": (splan.read_a, splan.vec_a), "w": (splan.read_b, splan.vec_b)}
        if pass_ is Pass.WGRAD:
            reads["x"] = (splan.read_b, splan.vec_b)
        if cpad is not None:  # the pad copy reads x (and fprop's w) in 16-byte loads
            with _rt._cupy().cuda.Device(device):
                self._copies = ChannelPad(p, pass_, cpad, self.out_dtype.itemsize)
            reads["x"] = reads["w"] = (in_dtype, 8)
        elif slabs is not None:  # the expand copy reads w, as the kernel will read it, one element at a time
            with _rt._cupy().cuda.Device(device):
                self._copies = GroupPack(p, slabs, np_dtype(reads["w"][0]).itemsize)
            reads["w"] = (reads["w"][0], 1)
        self._expect = tuple(
            (name, shape, np_dtype(reads[name][0]), _contiguous_strides(shape, np_dtype(reads[name][0]).itemsize),
             reads[name][1] * np_dtype(reads[name][0]).itemsize, reads[name][0], reads[name][1])
            for name, shape in inputs
        )
        batch = p.n
        # dw's (or y's, dx's) fp32 slices, then db's, 16-byte aligned, in one workspace
        self._ws_elems = -(-src.workspace_elems(batch) // 4) * 4
        self._db_ws_elems = src.db_workspace_elems(batch)
        self._pad_at = -(-(self._ws_elems + self._db_ws_elems) // 4) * 4  # the copies' scratch, 16-byte aligned
        self._arena_views: tuple[Any, Any] = (None, None)
        self._launchers = [_Launcher(self._kernel.main, src.grid(batch), src.main.block, src.main.shared_mem,
                                     src.main.args, pass_, src.main.cooperative)]
        if src.reduce is not None:
            self._launchers.append(_Launcher(self._kernel.reduce, (src.reduce.grid_x(batch), 1, 1), src.reduce.block,
                                             0, src.reduce.args, pass_))
        self._scalars = (np.int32(batch), np.int64(self._kernel.gemm_m(batch)), np.float32(alpha), np.float32(beta))
        # what launch() checks a call's pointers against, without a property or a lookup
        self._aligns = (self._expect[0][4], self._expect[1][4])
        self._residual_on = self.epilogue.residual
        self._ws_needed = self.workspace_elems > 0
        self._maps = None
        self._store = False  # the copy engine stores y too (TmaWgmma.tma_store): a third map, of out0
        if splan.tma:  # the copy engine reads both inputs through maps of their addresses
            from .tma import TmaMaps

            flags = splan.loop.flags()
            store = (FRAG * drain_group(splan), epilogue.out_dtype) if flags.tma_store else None
            self._maps = TmaMaps(kp, pass_, splan.block_m, splan.block_n, self.mma_dtype, flags.halo_pitch,
                                 flags.cluster, store)
            self._store = store is not None

    @property
    def plan(self) -> Optional[Plan]:
        """The plan this op's kernel runs: the caller's, else this GPU's tuned one, else the
        tuner's on first use (autotune on), else the planner's; None for an empty batch (no
        kernel).  A benchmark that names its plans reads them here, after the first call."""
        return self._kernel.source.spec.plan if self._kernel is not None else None

    @property
    def workspace_elems(self) -> int:
        """fp32 elements of workspace a call needs (0 without split-K or copies around the
        kernel): the size of a caller-supplied ``workspace``."""
        if self._copies is not None:
            return self._pad_at + self._copies.scratch_elems
        return self._ws_elems + self._db_ws_elems

    # -- the call ------------------------------------------------------------
    def _input(self, a: Any, name: str, shape: tuple, dtype: Any, strides: tuple, align: int, read: str,
               vec: int) -> Any:
        """`a` itself when the kernel reads it as it is, else the plain path's copy; the
        full checks (naming the argument) run only off the fast path."""
        try:
            mem = a.data
            if (a.shape == shape and a.dtype is dtype and a.strides == strides and not mem.ptr % align
                    and mem.device_id == self.device):
                return a
        except AttributeError:
            pass
        _rt._check_array(name, a, len(shape))
        if a.shape != shape:
            raise ValueError(f"{name} has shape {a.shape}; this prepared {self.pass_.value} was built for {shape}")
        if a.data.device_id != self.device:
            raise ValueError(f"{name} is on device {a.data.device_id}; this op was built for device {self.device}")
        return _rt._operand(name, a, read, vec)

    def _residual(self, r: Any) -> Any:
        """fprop's residual, as the epilogue reads it: y's shape and dtype on the op's device,
        dense and 16-byte aligned (the drain reads it in y's vector runs).  A view that is
        not is copied, as the inputs are (it is read, never written)."""
        cupy = _rt._cupy()
        shape = self.out_shapes[0]
        if (not isinstance(r, cupy.ndarray) or r.shape != shape or r.dtype != self.out_dtype
                or r.data.device_id != self.device):
            raise ValueError(f"residual must be a {self.out_dtype.name} cupy.ndarray of y's shape "
                             f"{shape} on device {self.device}, got "
                             f"{getattr(r, 'dtype', type(r).__name__)} {getattr(r, 'shape', '')}")
        if r.strides != self._out_strides[0] or r.data.ptr % 16:
            r = cupy.ascontiguousarray(r) if r.strides != self._out_strides[0] else r.copy()
        return r

    def _output(self, out: Any, i: int) -> Any:
        shape = self.out_shapes[i]
        if out is None:
            return _rt._empty(shape, self.out_dtype)
        try:
            mem = out.data
            if (out.shape == shape and out.dtype is self.out_dtype and out.strides == self._out_strides[i]
                    and not mem.ptr % 16 and mem.device_id == self.device):
                return out
        except AttributeError:
            pass
        name = "out" if self._n_out == 1 else f"out[{i}]"
        cupy = _rt._cupy()
        if not isinstance(out, cupy.ndarray):
            raise TypeError(f"{name} must be a cupy.ndarray, got {type(out).__name__}")
        if out.data.device_id != self.device:
            raise ValueError(f"{name} is on device {out.data.device_id}; this op runs on device {self.device}")
        raise ValueError(f"{name} must be a C-contiguous, 16-byte aligned {self.out_dtype.name} array of shape "
                         f"{shape}, got {out.dtype.name} {out.shape} with strides {out.strides}")

    def __call__(self, a: Any, b: Any, bias: Any = None, *, residual: Any = None, out: Any = None,
                 workspace: Any = None) -> Any:
        """fprop: ``op(x, w[, bias], out=y)`` -> y, and ``residual=r`` (y's shape and dtype)
        when the op was prepared with one.  dgrad: ``op(dy, w, out=dx)`` -> dx.
        wgrad: ``op(x, dy, out=(dw, db))`` -> (dw, db) (db None without bias).

        ``workspace``: an fp32 CuPy array of at least :attr:`workspace_elems` elements that
        the call may overwrite, instead of the stream's arena buffer (a framework that owns
        its memory, or a graph capture with its own pool, passes one)."""
        if out is None or not isinstance(out, tuple):
            outs = (out, None) if self._n_out == 2 else (out,)
        elif len(out) == self._n_out:
            outs = out
        else:
            raise ValueError(f"out must hold {self._n_out} array(s) for this {self.pass_.value}, got {len(out)}")
        if (bias is not None) != self._bias:
            raise ValueError("bias: this prepared op was built " + ("with" if self.epilogue.bias else "without")
                             + " a bias" + ("" if self.pass_ is Pass.FPROP else f"; {self.pass_.value} takes none"))
        if (residual is not None) != self.epilogue.residual:
            raise ValueError("residual: this prepared op was built " + ("with" if self.epilogue.residual else "without")
                             + " a residual" + ("" if self.pass_ is Pass.FPROP else f"; {self.pass_.value} takes none"))
        cupy = _rt._cupy()
        if self._kernel is None:  # an empty batch: no output element, and zero gradients
            res = [self._output(o, i) for i, o in enumerate(outs)]
            for r in res:
                r.fill(0)
            return self._result(res)
        switch = cupy.cuda.runtime.getDevice() != self.device
        if switch:
            ctx = cupy.cuda.Device(self.device)
            ctx.__enter__()
        try:
            ea, eb = self._expect
            a = self._input(a, *ea)
            b = self._input(b, *eb)
            res = [self._output(o, i) for i, o in enumerate(outs)]
            if bias is not None:
                bias = _rt._operand("bias", bias, self.epilogue.bias_dtype, self._bias_vec)
            if residual is not None:
                residual = self._residual(residual)
            ws, dbws = self._workspaces(workspace)
            objs = [a, b, bias, res[0], res[1] if self._n_out == 2 else None, ws, dbws, *self._scalars, residual]
            scratch = 0
            if self._copies is not None:
                scratch = (workspace if workspace is not None else self._arena_buf).data.ptr + 4 * self._pad_at
            self._run(objs, a.data.ptr, b.data.ptr, res[0].data.ptr, scratch, None)
        finally:
            if switch:
                ctx.__exit__(None, None, None)
        return self._result(res)

    def launch(self, a: int, b: int, out: tuple[int, ...], *, bias: int = 0, residual: int = 0, workspace: int = 0,
               stream: int = 0) -> None:
        """The call for a framework that owns its memory (convgen.torch): device pointers, on
        the op's device (current), of dense arrays of exactly the op's shapes and dtypes (the
        inputs as :attr:`input_dtypes`, the outputs :attr:`out_dtype`), with ``workspace`` an
        fp32 buffer of :attr:`workspace_elems` elements, launched on the raw ``stream``.

        Only the pointers are checked (present, aligned for the kernel's vector accesses):
        the caller vouches for the rest, which is what lets this path skip building CuPy
        arrays (a few microseconds each).  Anything unsure belongs in ``__call__``."""
        # One expression of cheap tests on the common path; the messages only on a failure.
        try:
            align_a, align_b = self._aligns
            bad = (not a or a % align_a or not b or b % align_b or len(out) != self._n_out
                   or not out[0] or out[0] % 16 or (self._n_out == 2 and (not out[1] or out[1] % 16))
                   or bool(bias) != self._bias or bias % 16 or bool(residual) != self._residual_on or residual % 16
                   or (self._ws_needed and (not workspace or workspace % 16)))
        except AttributeError:  # an empty batch's op has no kernel, and so none of these
            bad = True
        if bad:
            self._refuse(a, b, out, bias, residual, workspace)
        ws = dbws = None
        if self._ws_elems:
            ws = _ptr(workspace)
            dbws = _ptr(workspace + 4 * self._ws_elems) if self._db_ws_elems else None
        handle = _STREAMS.get(stream)
        if handle is None:
            if len(_STREAMS) >= 256:  # a program that makes streams by the thousand: start over
                _STREAMS.clear()
            handle = _STREAMS.setdefault(stream, _Stream(stream))
        objs = [_ptr(a), _ptr(b), _ptr(bias) if bias else None, _ptr(out[0]),
                _ptr(out[1]) if self._n_out == 2 else None, ws, dbws, *self._scalars, _ptr(residual) if residual else None]
        self._run(objs, a, b, out[0], workspace + 4 * self._pad_at if self._copies is not None else 0, handle)

    def _refuse(self, a: int, b: int, out: tuple[int, ...], bias: int, residual: int, workspace: int) -> None:
        """launch()'s checks one by one, raising for the first that fails, naming the argument."""
        if self._kernel is None:
            raise ValueError("launch: this op's batch is empty, there is nothing to launch (its __call__ "
                             "zero-fills the outputs)")
        if len(out) != self._n_out:
            raise ValueError(f"out must hold {self._n_out} pointer(s) for this {self.pass_.value}, got {len(out)}")
        (ea, eb) = self._expect
        for name, ptr, align in ((ea[0], a, ea[4]), (eb[0], b, eb[4]), *(
                ("out" if self._n_out == 1 else f"out[{i}]", o, 16) for i, o in enumerate(out))):
            if not ptr or ptr % align:
                raise ValueError(f"{name} must be a nonzero device pointer aligned to {align} bytes, got {ptr:#x}")
        if bool(bias) != self._bias:
            raise ValueError("bias: this prepared op was built " + ("with" if self._bias else "without") + " a bias")
        if bias % 16:
            raise ValueError(f"bias must be aligned to 16 bytes, got {bias:#x}")
        if bool(residual) != self.epilogue.residual:
            raise ValueError("residual: this prepared op was built " + ("with" if self.epilogue.residual else "without")
                             + " a residual")
        if residual % 16:
            raise ValueError(f"residual must be aligned to 16 bytes, got {residual:#x}")
        raise ValueError(f"workspace: this op needs {self.workspace_elems} fp32 elements of workspace "
                         f"(split-K slices, padded channels), 16-byte aligned; got {workspace:#x}")

    def _run(self, objs: list, a: int, b: int, out0: int, scratch: int, stream: Any) -> None:
        """The launches both calls make, on ``objs`` (the kernel's arguments, by slot): the
        copies into ``scratch`` first where the op has them (narrow channels padded, groups'
        weights packed: the kernel then reads, and wgrad writes, the copies), the tensor maps of
        what the kernel reads, the kernels, and wgrad's padded or packed dW copied back into the
        caller's ``out0``."""
        dwp = 0
        if self._copies is not None:
            a, b, dwp = self._copies.pad(a, b, scratch, stream)
            objs[0], objs[1] = _ptr(a), _ptr(b)
            if dwp:
                objs[3] = _ptr(dwp)
        if self._maps is not None:
            objs += (self._maps.a(a), self._maps.b(b), self._maps.out(out0)) if self._store else \
                (self._maps.a(a), self._maps.b(b))
        for launcher in self._launchers:
            launcher.launch(objs, stream)
        if dwp:
            self._copies.unpad(dwp, out0, stream)

    @property
    def input_dtypes(self) -> tuple[str, str]:
        """The dtypes :meth:`launch` wants for its two inputs (what the kernel reads)."""
        return (self._expect[0][5], self._expect[1][5]) if self._kernel is not None else (self.in_dtype,) * 2

    def _workspaces(self, workspace: Any) -> tuple[Any, Any]:
        """The split-K slices ((None, None) without split-K), from the caller's workspace or
        the stream's arena buffer, which is :attr:`_arena_buf` after the call (the channel
        pad's scratch lies in it too, from :attr:`_pad_at`)."""
        elems = self.workspace_elems
        if not elems:
            return None, None
        if workspace is not None:  # the caller's: never kept past the call
            _check_workspace(workspace, elems, self.device)
            if not self._ws_elems:
                return None, None
            return workspace, (workspace[self._ws_elems:] if self._db_ws_elems else None)
        cupy = _rt._cupy()
        buf = _ARENA.get(self.device, cupy.cuda.get_current_stream().ptr, elems)
        if buf is not self._arena_buf:  # views of a new arena buffer, made once per buffer
            self._arena_buf = buf
            self._arena_views = ((buf, buf[self._ws_elems:] if self._db_ws_elems else None) if self._ws_elems
                                 else (None, None))
        return self._arena_views

    def _result(self, res: list) -> Any:
        if self.pass_ is Pass.WGRAD:
            return (res[0], res[1] if len(res) > 1 else None)
        return res[0]


def _check_workspace(ws: Any, elems: int, device: int) -> None:
    cupy = _rt._cupy()
    if (not isinstance(ws, cupy.ndarray) or ws.dtype != _F32 or ws.ndim != 1 or ws.size < elems
            or ws.strides != (4,) or ws.data.ptr % 16 or ws.data.device_id != device):
        raise ValueError(f"workspace must be a contiguous, 16-byte aligned 1-D float32 array of at least {elems} "
                         f"elements on device {device}, got {getattr(ws, 'dtype', type(ws).__name__)} "
                         f"{getattr(ws, 'shape', '')}")


def _bind(pass_: Pass | str, x_shape: tuple[int, int, int, int], w_shape: tuple[int, int, int, int], *,
          stride: PairLike = 1, padding: PairLike | str = 0, dilation: PairLike = 1, bias: bool = False,
          bias_dtype: Any = "float32", activation: Optional[str] = None, in_dtype: Any = "float16",
          out_dtype: Any = None, device: Optional[int] = None, plan: Optional[Plan] = None,
          residual: bool = False, alpha: float = 1.0, beta: float = 1.0, mma_dtype: Optional[str] = None,
          groups: int = 1) -> tuple:
    """prepare()'s arguments checked and turned into what PreparedConv takes."""
    p = Pass.parse(pass_)
    for name, shape in (("x_shape", x_shape), ("w_shape", w_shape)):
        if not isinstance(shape, (tuple, list)) or len(shape) != 4:
            raise ValueError(f"{name} must be a 4-tuple ({'N, H, W, C' if name == 'x_shape' else 'K, R, S, C'}), "
                             f"got {shape!r}")
    n, h, w, c = x_shape
    k, r, s, wc = w_shape
    groups = _rt._groups(groups)
    _rt._check_group_channels(wc, c, groups, "w_shape", "x_shape (x_shape[3])")
    if activation not in (None, "relu", "gelu"):
        raise ValueError(f"activation must be None, 'relu' or 'gelu', got {activation!r}")
    if activation is not None and p is not Pass.FPROP:
        raise ValueError(f"activation is an fprop epilogue; {p.value} cannot apply it")
    if not isinstance(residual, bool):
        raise ValueError(f"residual must be True or False, got {residual!r}")
    if residual and p is not Pass.FPROP:
        raise ValueError(f"residual is an fprop epilogue; {p.value} cannot add one")
    _rt._check_scales(alpha, beta, residual, "residual=True")
    if bias and p is Pass.DGRAD:
        raise ValueError("bias does not apply to dgrad (dx does not depend on the bias)")
    in_name = dtype_name(in_dtype) if isinstance(in_dtype, (str, np.dtype, type)) else None
    if in_name not in ("float16", "bfloat16", "float32"):
        raise ValueError(f"in_dtype must be float16, bfloat16 or float32, got {in_dtype!r} ({BF16_HINT})")
    elem = resolve_mma_dtype(in_name, mma_dtype)
    b_name = dtype_name(bias_dtype) if isinstance(bias_dtype, (str, np.dtype, type)) else None
    if b_name not in ("float16", "bfloat16", "float32"):
        raise ValueError(f"bias_dtype must be float16, bfloat16 or float32, got {bias_dtype!r}")
    if b_name != "float32" and not (bias and p is Pass.FPROP):
        raise ValueError("bias_dtype is what fprop reads its bias as; it needs pass_='fprop' and bias=True")
    problem = _rt._problem(n, h, w, c, k, r, s, stride, padding, dilation, groups)
    epi = Epilogue(bias=bool(bias), relu=activation == "relu", gelu=activation == "gelu",  # type: ignore[arg-type]
                   out_dtype=_rt._out_dtype(out_dtype, elem), bias_dtype=b_name, residual=residual)  # type: ignore[arg-type]
    check_dtypes(in_name, elem, epi.out_dtype, epi.bias_dtype)  # before any device is touched
    cupy = _rt._cupy()
    dev = cupy.cuda.runtime.getDevice() if device is None else int(device)
    return p, problem, epi, in_name, dev, plan, False, float(alpha), float(beta), elem


def prepare(
    pass_: Pass | str, x_shape: tuple[int, int, int, int], w_shape: tuple[int, int, int, int], *,
    stride: PairLike = 1, padding: PairLike | str = 0, dilation: PairLike = 1, bias: bool = False,
    bias_dtype: Any = "float32", activation: Optional[str] = None, in_dtype: Any = "float16",
    out_dtype: Any = None, device: Optional[int] = None, plan: Optional[Plan] = None,
    residual: bool = False, alpha: float = 1.0, beta: float = 1.0, mma_dtype: Optional[str] = None,
    groups: int = 1,
) -> PreparedConv:
    """Bind one pass of one conv2d (NHWC ``x_shape``, KRSC ``w_shape``) and its options.

    fprop takes ``bias`` (the op then wants a bias array, read as ``bias_dtype``: float32,
    or float16 for a float16 model's bias with no cast first), ``activation`` (None, "relu"
    or "gelu") and ``residual`` (the op then wants ``residual=r`` of y's shape and dtype, and
    computes ``act(alpha * conv + bias + beta * r)``); wgrad's ``bias`` makes it return db too.  ``in_dtype`` is the dtype the op's
    inputs will have (float16, bfloat16, or float32 to let the plan read it in the gather);
    bfloat16 arrays are CuPy arrays of ``ml_dtypes.bfloat16`` (NumPy and CuPy have no bfloat16 of
    their own; CuPy 14 takes ml_dtypes'), and ``in_dtype`` may be given as ``"bfloat16"`` or
    ``ml_dtypes.bfloat16``.  ``mma_dtype`` ("float16" or "bfloat16"; None: the inputs' 16-bit
    type, float16 for float32) is what the MMAs read: float32 inputs are rounded to it.
    ``out_dtype`` None is the MMAs' 16-bit type; a 16-bit ``bias_dtype`` or ``out_dtype`` must
    be the MMAs' (a kernel has one 16-bit type).  The op runs on ``device`` (default: CuPy's
    current device).  ``groups`` as in ``torch.nn.functional.conv2d`` (``w_shape`` is then
    (K, R, S, C / groups)).
    """
    return PreparedConv(*_bind(pass_, x_shape, w_shape, stride=stride, padding=padding, dilation=dilation, bias=bias,
                               bias_dtype=bias_dtype, activation=activation, in_dtype=in_dtype, out_dtype=out_dtype,
                               device=device, plan=plan, residual=residual, alpha=alpha, beta=beta,
                               mma_dtype=mma_dtype, groups=groups))


def prepare_many(layers: Sequence[Mapping[str, Any]], *, workers: Optional[int] = None) -> list[PreparedConv]:
    """:func:`prepare` for many layers at once (each a dict of prepare's arguments, ``pass_``
    among them), with every kernel not yet in the caches compiled in parallel.

    A network's first step otherwise compiles its kernels one after another as its layers
    first run (about a second each with NVRTC).  NVRTC runs outside Python's lock, so
    threads compile side by side; the ops are then built in order, each finding its binary
    in the memory cache.  ``workers`` defaults to the machine's CPU count.  A layer the
    tuner will tune on first use (autotune on, no tuned plan) is tuned when its op is built,
    as :func:`prepare` would."""
    from .compile import compile_async

    bound = [_bind(**dict(layer)) for layer in layers]
    sources = [_rt._planned_source(problem, pass_, epi, in_name, dev, plan, scalar=False, tune=False, mma_dtype=elem)
               for pass_, problem, epi, in_name, dev, plan, _, _, _, elem in bound if problem.n]
    for fut in compile_async([(src.source, src.compile_arch) for src in sources], workers):
        fut.result()  # re-raises a failure (a CompileError names its source)
    return [PreparedConv(*args) for args in bound]
