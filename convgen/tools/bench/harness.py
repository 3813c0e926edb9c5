"""`convgen bench` on the GPU: the session (CuPy, torch/cuDNN, the device, the data both
sides read), the ceilings, the launch floor, and the timing of each row.

Each row gets three figures per side: GPU time with the host hidden, eager time per call
(calls back to back, wall clock), and host cost per call; see :mod:`convgen.tools.timing`.
What each side computes comes from :func:`.rows.work`: by default the same work on both.

Timing method (see benchmarks/README.md and :mod:`convgen.tools.timing`): CUDA events
around only the op, one pair per rep; before every rep a short spin kernel (so the host
is always ahead of the GPU and no launch gap is timed) and a 256 MiB write that flushes
L2; reps of convgen and cuDNN interleaved (A B A B ...); the median is reported.
``triton.testing.do_bench`` is not used: it times one function at a time (no
interleaving), and torch/triton would then be needed even for a convgen-only run.
Nothing here imports CuPy or torch at module import time.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import math
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ... import config
from ...ir import ConvProblem, Pass, Target
from ..timing import L2_FLUSH_BYTES, MIN_SPIN_US, CudaDevice, eager_interleaved, host_overhead, time_interleaved
from .report import build_result, git_info, group
from .rows import (FUSED, LABELS, RESIDUAL, LOW_RATE_TFLOPS, REFERENCE_GBPS, REFERENCE_SOURCE, REFERENCE_TFLOPS, SAME,
                   TOLERANCE, Item, _err, finish_row, new_row, plan_run, plans_setting, torch_conv_args,
                   torch_weight_shape, work)
from .stats import time_stats

GEMM_SIZE = 8192
COPY_BYTES = 2 << 30


class Progress:
    """tqdm on stderr when it is importable, else a plain counter (at most ~10 lines
    when stderr is not a terminal)."""

    def __init__(self, total: int, enabled: bool = True, desc: str = "bench") -> None:
        self.total, self.done, self.enabled = total, 0, enabled
        self._bar = None
        self._tty = sys.stderr.isatty()
        if enabled:
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, desc=desc, unit="row", file=sys.stderr, dynamic_ncols=True,
                                 mininterval=0.5 if self._tty else 10.0)
            except ImportError:
                self._bar = None

    def step(self, label: str) -> None:
        """Say that `label` is starting."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(label, refresh=False)
        elif self._tty:
            print(f"\r[{self.done + 1}/{self.total}] {label:<50}", end="", file=sys.stderr, flush=True)
        else:
            every = max(1, self.total // 10)
            if self.done % every == 0:
                print(f"[{self.done + 1}/{self.total}] {label}", file=sys.stderr, flush=True)

    def update(self) -> None:
        self.done += 1
        if self.enabled and self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.enabled and self._tty:
            print(file=sys.stderr)


def _import_torch() -> tuple[Any, Optional[str]]:
    try:
        import torch
    except Exception as exc:
        return None, f"torch is not importable ({type(exc).__name__}: {exc})"
    try:
        if not torch.cuda.is_available():
            return None, "torch has no CUDA device (torch.cuda.is_available() is False)"
    except Exception as exc:
        return None, f"torch CUDA is not usable ({type(exc).__name__}: {exc})"
    return torch, None


def _environment(cupy: Any, torch: Any, target: Target) -> dict[str, Any]:
    import convgen
    from ... import compile as cc

    rt = cupy.cuda.runtime
    dev_id = cupy.cuda.Device().id
    props = rt.getDeviceProperties(dev_id)
    name = props.get("name", b"")
    name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)

    def ver(v: int) -> str:
        return f"{v // 1000}.{(v % 1000) // 10}"

    versions: dict[str, Any] = {"convgen": convgen.__version__, "cupy": cupy.__version__,
                                "python": platform.python_version(), "torch": None, "torch_cuda": None,
                                "cudnn": None, "driver": None, "cuda_runtime": None, "nvrtc": None}
    for key, fn in (("driver", lambda: ver(rt.driverGetVersion())),
                    ("cuda_runtime", lambda: ver(rt.runtimeGetVersion())),
                    ("nvrtc", lambda: "%d.%d" % cc.nvrtc_version())):
        try:
            versions[key] = fn()
        except Exception:
            pass
    if torch is not None:
        versions["torch"] = torch.__version__
        versions["torch_cuda"] = torch.version.cuda
        try:
            v = torch.backends.cudnn.version()
            versions["cudnn"] = None if v is None else f"{v // 10000}.{(v % 10000) // 100}.{v % 100}"
        except Exception:
            pass
    gpu = {"name": name, "device": dev_id, "arch": target.arch, "sm_count": target.sm_count,
           "memory_bytes": props.get("totalGlobalMem"), "l2_bytes": props.get("l2CacheSize")}
    return {"gpu": gpu, "versions": versions}


class Session:
    """Everything one run needs on the GPU: CuPy, torch (or None), the device, the stream."""

    def __init__(self, cupy: Any, torch: Any, dev: CudaDevice, target: Target, args: argparse.Namespace) -> None:
        self.cp, self.torch, self.dev, self.target, self.args = cupy, torch, dev, target, args

    # ----------------------------------------------------------------- ceilings
    def ceilings(self) -> dict[str, Any]:
        """The fp16 GEMM rate (TFLOP/s) and the device-to-device copy bandwidth (GB/s, bytes
        read + written), medians of 10 after 3 warm-up runs, measured here and now."""
        cp, torch = self.cp, self.torch
        n = GEMM_SIZE
        out: dict[str, Any] = {"gemm_tflops": None, "gemm_size": n, "gemm_us": None,
                               "gemm_source": "torch.matmul fp16" if torch is not None else "cupy.matmul fp16 (cuBLAS)",
                               "copy_gbps": None, "copy_bytes": COPY_BYTES, "copy_us": None,
                               "copy_source": "cudaMemcpyAsync device to device", "errors": []}
        try:
            t = self._median_run(self._gemm_op)
            out["gemm_us"] = time_stats(t)
            out["gemm_tflops"] = 2.0 * n ** 3 / (statistics.median(t) * 1e6)
        except Exception as exc:
            out["errors"].append("gemm: " + _err(exc))
        try:
            t = self._median_run(self._copy_op)
            out["copy_us"] = time_stats(t)
            out["copy_gbps"] = 2.0 * COPY_BYTES / (statistics.median(t) * 1e3)  # read + write
        except Exception as exc:
            out["errors"].append("copy: " + _err(exc))
        self.dev.sync()
        cp.get_default_memory_pool().free_all_blocks()
        if torch is not None:
            torch.cuda.empty_cache()
        return out

    def _median_run(self, make: Callable[[], Callable[[], Any]], reps: int = 10) -> list[float]:
        fn = make()  # holds its buffers; they are released when this returns
        for _ in range(3):
            fn()
        return time_interleaved(self.dev, [("op", fn)], reps, flush=False, spin_us=0.0)["op"]

    def _gemm_op(self) -> Callable[[], Any]:
        cp, torch, n = self.cp, self.torch, GEMM_SIZE
        if torch is not None:
            a = torch.randn(n, n, device="cuda", dtype=torch.float16)
            b = torch.randn(n, n, device="cuda", dtype=torch.float16)
            return lambda: torch.matmul(a, b)
        import numpy as np

        rng = np.random.default_rng(0)
        ca = cp.asarray(rng.standard_normal((n, n), dtype=np.float32).astype(np.float16))
        cb = cp.asarray(rng.standard_normal((n, n), dtype=np.float32).astype(np.float16))
        return lambda: cp.matmul(ca, cb)

    def _copy_op(self) -> Callable[[], Any]:
        cp = self.cp
        src = cp.empty(COPY_BYTES, dtype=cp.uint8)
        dst = cp.empty(COPY_BYTES, dtype=cp.uint8)
        src.fill(1)
        return lambda: dst.data.copy_from_device_async(src.data, COPY_BYTES)

    # ----------------------------------------------------------------- data
    def make_data(self, problem: ConvProblem, seed: int) -> dict[str, Any]:
        """fp16 data made once; convgen (CuPy, NHWC/KRSC) and cuDNN (torch NCHW views in
        channels_last memory) read the very same bytes.  w is (K, R, S, C/groups) on convgen's
        side and (K, C/groups, R, S) on PyTorch's."""
        cp, torch = self.cp, self.torch
        fan_in = problem.r * problem.s * problem.cg
        d: dict[str, Any] = {}
        if torch is not None:
            g = torch.Generator(device="cuda")
            g.manual_seed(seed)

            def randn(shape: tuple[int, ...], scale: float = 1.0) -> Any:
                t = torch.randn(shape, generator=g, device="cuda", dtype=torch.float32)
                return (t * scale).to(torch.float16) if scale != 1.0 else t.to(torch.float16)

            x = randn(problem.x_shape)  # NHWC
            w = randn(problem.w_shape, 1.0 / math.sqrt(fan_in))  # KRSC
            dy = randn(problem.y_shape)  # NPQK
            b = randn((problem.k,))
            # NCHW / KCRS logical views of the NHWC / KRSC memory: channels_last tensors
            d["x_t"], d["w_t"], d["dy_t"] = (t.permute(0, 3, 1, 2) for t in (x, w, dy))
            d["b_t"] = b
            for name in ("x_t", "w_t", "dy_t"):
                if not d[name].is_contiguous(memory_format=torch.channels_last):
                    raise RuntimeError(f"{name} is not channels_last")  # pragma: no cover
            if tuple(d["w_t"].shape) != torch_weight_shape(problem):
                raise RuntimeError(f"w_t is {tuple(d['w_t'].shape)}, not {torch_weight_shape(problem)}")  # pragma: no cover
            d["x"], d["w"], d["dy"] = (cp.from_dlpack(t) for t in (x, w, dy))
            d["b32"] = cp.from_dlpack(b).astype(cp.float32)  # convgen reads the bias as fp32: same values
            if d["x"].data.ptr != x.data_ptr() or d["dy"].data.ptr != dy.data_ptr():
                raise RuntimeError("DLPack made a copy")  # pragma: no cover
        else:  # drawn on the host (numpy) and copied up: no cuRAND needed
            import numpy as np

            rng = np.random.default_rng(seed)

            def up(shape: tuple[int, ...], scale: float = 1.0, dtype: str = "float16") -> Any:
                a = rng.standard_normal(shape, dtype=np.float32)
                if scale != 1.0:
                    a *= scale
                return cp.asarray(a.astype(np.float16).astype(dtype))

            d["x"] = up(problem.x_shape)
            d["w"] = up(problem.w_shape, 1.0 / math.sqrt(fan_in))
            d["dy"] = up(problem.y_shape)
            d["b32"] = up((problem.k,), dtype="float32")  # fp16 values, as the torch path has
        for name in ("x", "w", "dy"):
            if not d[name].flags.c_contiguous:
                raise RuntimeError(f"{name} is not contiguous: convgen would copy it on every call")  # pragma: no cover
        return d

    # ----------------------------------------------------------------- ops
    def ops(self, problem: ConvProblem, pass_: Pass, d: dict[str, Any], variant: str = SAME
            ) -> tuple[Callable[[], Any], Optional[Callable[[], Any]]]:
        """convgen's call and cuDNN's for one row, computing the same outputs: without bias
        in the same-work rows; with bias (fprop: and ReLU, PyTorch's as a separate op) in
        the fused rows.  A grouped layer passes groups=G to both sides; an ungrouped one
        calls convgen exactly as before (no groups argument)."""
        import convgen

        st, pad, dil = problem.stride, problem.padding, problem.dilation
        gkw: dict[str, Any] = {"groups": problem.groups} if problem.groups > 1 else {}
        torch = self.torch
        bias, relu = work(pass_, variant)
        residual = variant == RESIDUAL  # the residual r is dy's data: fp16, y's shape, NHWC (channels_last)
        if pass_ is Pass.FPROP and residual:
            def cg() -> Any:
                return convgen.conv2d(d["x"], d["w"], d["b32"], stride=st, padding=pad, dilation=dil,
                                      activation="relu", residual=d["dy"], **gkw)
        elif pass_ is Pass.FPROP:
            b32 = d["b32"] if bias else None
            act = "relu" if relu else None

            def cg() -> Any:
                return convgen.conv2d(d["x"], d["w"], b32, stride=st, padding=pad, dilation=dil, activation=act,
                                      **gkw)
        elif pass_ is Pass.DGRAD:
            xs = problem.x_shape

            def cg() -> Any:
                return convgen.conv2d_dgrad(d["dy"], d["w"], xs, stride=st, padding=pad, dilation=dil, **gkw)
        else:
            ws = problem.w_shape

            def cg() -> Any:
                return convgen.conv2d_wgrad(d["x"], d["dy"], ws, stride=st, padding=pad, dilation=dil, bias=bias,
                                            **gkw)
        if torch is None:
            return cg, None
        F = torch.nn.functional
        aten = torch.ops.aten
        sl, pl, dl, g = torch_conv_args(problem)
        if pass_ is Pass.FPROP and residual:
            def cd() -> Any:
                return F.relu(F.conv2d(d["x_t"], d["w_t"], d["b_t"], sl, pl, dl, g) + d["dy_t"])
        elif pass_ is Pass.FPROP:
            bt = d["b_t"] if bias else None
            if relu:
                def cd() -> Any:
                    return F.relu(F.conv2d(d["x_t"], d["w_t"], bt, sl, pl, dl, g))
            else:
                def cd() -> Any:
                    return F.conv2d(d["x_t"], d["w_t"], bt, sl, pl, dl, g)
        elif pass_ is Pass.DGRAD:
            def cd() -> Any:
                return aten.convolution_backward(d["dy_t"], d["x_t"], d["w_t"], None, sl, pl, dl, False, [0, 0], g,
                                                 [True, False, False])[0]
        else:
            bsz = [problem.k] if bias else None

            def cd() -> Any:
                _, dw, db = aten.convolution_backward(d["dy_t"], d["x_t"], d["w_t"], bsz, sl, pl, dl, False,
                                                      [0, 0], g, [False, True, bias])
                return (dw, db) if bias else (dw,)
        return cg, cd

    def compare(self, pass_: Pass, cg_out: Any, cd_out: Any) -> dict[str, Any]:
        """Norm-relative difference of convgen's output(s) from cuDNN's, in fp32 on the GPU."""
        cp = self.cp

        def as_cupy_nhwc(t: Any) -> Any:
            return cp.from_dlpack(t.permute(0, 2, 3, 1) if t.dim() == 4 else t)

        def rel(a: Any, b: Any) -> float:  # reductions only (no cuBLAS), fp64 sums
            a = a.astype(cp.float32).ravel()
            b = b.astype(cp.float32).ravel()
            diff = a - b
            den = math.sqrt(float(cp.sum(b * b, dtype=cp.float64)))
            num = math.sqrt(float(cp.sum(diff * diff, dtype=cp.float64)))
            if not math.isfinite(num):
                return float("inf")
            return num / max(den, 1e-30)

        if pass_ is Pass.WGRAD:
            mine = [o for o in cg_out if o is not None]
            names = ["dw", "db"][: len(mine)]
            theirs = list(cd_out)
        else:
            mine, theirs, names = [cg_out], [cd_out], (["y"] if pass_ is Pass.FPROP else ["dx"])
        parts = {}
        for name, a, b in zip(names, mine, theirs):
            b = as_cupy_nhwc(b)
            if a.shape != b.shape:
                raise RuntimeError(f"{name}: convgen shape {a.shape} vs cuDNN {b.shape}")
            parts[name] = rel(a, b)
        err = max(parts.values())
        return {"rel_err": err, "parts": parts, "tol": TOLERANCE, "ok": err < TOLERANCE}

    # ----------------------------------------------------------------- compile time
    def compile_times(self, cg: Callable[[], Any], tmp_root: Path, index: int) -> tuple[float, float]:
        """(cold ms, warm-disk ms) of convgen's first call: a fresh CONVGEN_CACHE_DIR and empty
        memory caches (plan, emit, NVRTC, load, one launch), then memory caches emptied again
        with the disk entry kept (read, load, one launch)."""
        import convgen
        from ... import compile as cc

        times = []
        with config.overridden(config.CACHE_DIR, str(tmp_root / f"row{index}")):
            for _ in range(2):
                convgen.clear_cache()
                cc.clear_memory_cache()
                self.dev.sync()
                t0 = time.perf_counter()
                cg()
                self.dev.sync()
                times.append((time.perf_counter() - t0) * 1e3)
        return times[0], times[1]

    # ----------------------------------------------------------------- one row
    def run_row(self, item: Item, row: dict[str, Any], d: dict[str, Any], index: int,
                tmp_root: Optional[Path]) -> None:
        args, dev = self.args, self.dev
        prob, pass_ = item.layer.problem, item.pass_
        cgr, cdr = row["convgen"], row["cudnn"]
        cg, cd = self.ops(prob, pass_, d, item.variant)
        ops: list[tuple[str, Callable[[], Any]]] = []
        cg_out = cd_out = None
        # convgen: compile (timed cold and warm), then warm up
        try:
            if tmp_root is not None:
                cgr["compile_cold_ms"], cgr["compile_warm_ms"] = self.compile_times(cg, tmp_root, index)
            for _ in range(max(args.warmup, 1)):
                cg_out = cg()
            dev.sync()
            ops.append(("convgen", cg))
        except Exception as exc:
            cgr["error"] = _err(exc)
            cg_out = None
            _recover(dev)
        if cd is not None:
            try:
                dev.sync()
                t0 = time.perf_counter()
                cd_out = cd()
                dev.sync()
                cdr["first_call_ms"] = (time.perf_counter() - t0) * 1e3
                for _ in range(max(args.warmup - 1, 0)):
                    cd_out = cd()
                dev.sync()
                ops.append(("cudnn", cd))
            except Exception as exc:
                cdr["error"] = _err(exc)
                cd_out = None
                _recover(dev)
        if cg_out is not None and cd_out is not None:
            try:
                row["check"] = self.compare(pass_, cg_out, cd_out)
            except Exception as exc:
                row["check"] = {"rel_err": None, "parts": {}, "tol": TOLERANCE, "ok": None, "error": _err(exc)}
        cg_out = cd_out = None
        if not ops:
            return
        # host-side cost per call, GPU held busy
        host = {}
        if args.host_calls > 0:
            for name, fn in ops:
                side = cgr if name == "convgen" else cdr
                try:
                    side["host_us"], side["host_clean"] = host_overhead(dev, fn, args.host_calls)
                    host[name] = side["host_us"]
                except Exception as exc:
                    side["error"] = side["error"] or _err(exc)
                    _recover(dev)
        # GPU time: interleaved reps, L2 flushed, spin long enough that the host stays ahead
        # unmeasured host cost: a generous 100 us
        spin = max([MIN_SPIN_US if host else 100.0] + [1.5 * v for v in host.values()])
        row["spin_us"] = spin
        try:
            times = time_interleaved(dev, ops, args.reps, spin_us=spin)
            for name, samples in times.items():
                (cgr if name == "convgen" else cdr)["time_us"] = time_stats(samples)
        except Exception as exc:
            cgr["error"] = cgr["error"] or ("timing: " + _err(exc))
            _recover(dev)
        # eager time: calls back to back, wall clock to a final sync, per call; sides interleaved
        if getattr(args, "eager_calls", 0) > 0:
            try:
                eager = eager_interleaved(dev, ops, args.eager_calls, args.eager_trials)
                for name, samples in eager.items():
                    (cgr if name == "convgen" else cdr)["eager_us"] = time_stats(samples)
            except Exception as exc:
                cgr["error"] = cgr["error"] or ("eager timing: " + _err(exc))
                _recover(dev)

    # ----------------------------------------------------------------- launch floor
    def launch_floor(self, calls: int) -> dict[str, Any]:
        """The host cost per call of a bare CuPy RawKernel launch of an empty kernel: what
        any CuPy-launched call costs at the least, printed beside the rows' host costs."""
        out: dict[str, Any] = {"host_us": None, "host_clean": None, "calls": calls,
                               "what": "cupy.RawKernel launch of an empty kernel, grid 1, block 1, no arguments; "
                                       "host cost per call with the GPU held busy", "error": None}
        try:
            self.dev.empty()  # compile and load it first
            self.dev.sync()
            out["host_us"], out["host_clean"] = host_overhead(self.dev, self.dev.empty, calls)
        except Exception as exc:
            out["error"] = _err(exc)
            _recover(self.dev)
        return out


def _recover(dev: Any) -> None:
    try:
        dev.sync()
    except Exception:
        pass


def run_bench(args: argparse.Namespace, suites: Sequence[str], items: Sequence[Item]) -> dict[str, Any]:
    import cupy

    from ...compile import detect_target

    notes: list[str] = []
    torch = None
    if args.no_torch:
        notes.append("--no-torch: convgen alone; cuDNN fields are null")
    else:
        torch, why = _import_torch()
        if torch is None:
            notes.append(f"{why}: convgen alone; cuDNN fields are null")
            print(f"convgen bench: {why}; timing convgen alone", file=sys.stderr)
    if torch is not None:
        torch.backends.cudnn.benchmark = True
        if not torch.backends.cudnn.is_available():
            notes.append("torch reports cuDNN unavailable: the 'cudnn' side is PyTorch's non-cuDNN convolution")

    target = detect_target()
    if torch is not None:
        ptr = torch.cuda.current_stream().cuda_stream
        stream = cupy.cuda.ExternalStream(ptr) if ptr else cupy.cuda.Stream.null
    else:
        stream = cupy.cuda.Stream.null
    now = _dt.datetime.now(_dt.timezone.utc)
    git = git_info(override=args.commit or config.BENCH_COMMIT.get())
    tmp_root = None if args.no_compile_time else Path(tempfile.mkdtemp(prefix="convgen-bench-cache-"))
    grad = torch.no_grad() if torch is not None else contextlib.nullcontext()
    from ...runtime import _gpu_name

    gpu_name = _gpu_name(cupy.cuda.Device().id)
    rows = [new_row(it, target=target, with_cudnn=torch is not None, gpu_name=gpu_name) for it in items]
    try:
        with stream, grad:
            dev = CudaDevice(cupy, stream)
            env = _environment(cupy, torch, target)
            session = Session(cupy, torch, dev, target, args)
            progress = Progress(len(items) + 1, enabled=not args.no_progress)
            progress.step("ceilings")
            ceilings = session.ceilings()
            dev.recalibrate()  # the GEMM has brought the clocks up
            ceilings["spin_clock_mhz"] = dev.cycles_per_us
            launch = session.launch_floor(max(args.host_calls, 100))
            progress.update()
            data_key = None
            data: dict[str, Any] = {}
            for i, (it, row) in enumerate(zip(items, rows)):
                progress.step(it.label)
                key = (it.suite, it.layer.name)
                if key != data_key:  # one data set per layer, shared by its passes
                    data = {}
                    session.dev.sync()
                    try:
                        data = session.make_data(it.layer.problem, seed=1000 + i)
                    except Exception as exc:
                        row["convgen"]["error"] = "data: " + _err(exc)
                    data_key = key
                if data:
                    session.run_row(it, row, data, i, tmp_root)
                    if row["convgen"].get("plan_source") == "first use" and not row["convgen"]["error"]:
                        try:  # the tuner chose during the row's first call: name what ran
                            row["convgen"]["plan"] = plan_run(it)
                        except Exception as exc:
                            row["convgen"]["error"] = "plan: " + _err(exc)
                finish_row(row, ceilings)
                progress.update()
            data = {}
            progress.close()
    finally:
        if tmp_root is not None:
            shutil.rmtree(tmp_root, ignore_errors=True)
    host = {}
    for side in ("convgen", "cudnn"):
        vals = [r[side]["host_us"] for r in rows if r.get(side) and r[side].get("host_us") is not None]
        host[side] = ({"median": statistics.median(vals), "min": min(vals), "max": max(vals), "rows": len(vals)}
                      if vals else None)
    settings = {
        "reps": args.reps, "warmup": args.warmup, "host_calls": args.host_calls,
        "eager_calls": args.eager_calls, "eager_trials": args.eager_trials,
        "work": LABELS[SAME], "fused": any(it.variant == FUSED for it in items),
        "fused_work": LABELS[FUSED], "residual": any(it.variant == RESIDUAL for it in items),
        "residual_work": LABELS[RESIDUAL], "low_rate_tflops": LOW_RATE_TFLOPS,
        "passes": sorted({it.pass_.value for it in items}, key=[p.value for p in Pass].index),
        "suites": list(suites), "layers_filter": args.layers, "torch": torch is not None,
        "cudnn_benchmark": True if torch is not None else None, "tolerance": TOLERANCE,
        "l2_flush_bytes": L2_FLUSH_BYTES, "min_spin_us": MIN_SPIN_US,
        "compile_time": not args.no_compile_time,
        "plans": plans_setting(),
        "timing": "CUDA events around the op only, one pair per rep; spin kernel + L2 flush before every rep; "
                  "convgen/cuDNN reps interleaved; median reported",
        "eager": "perf_counter from a synchronised start over eager_calls back-to-back calls to a final synchronise, "
                 "per call, no flush; eager_trials trials per side, interleaved; median reported",
        "host_cost": "perf_counter over host_calls back-to-back calls while a spin kernel holds the GPU, per call",
        "data": "fp16 N(0,1) x and dy, w scaled by 1/sqrt(R*S*C"
                + ("/groups" if any(it.layer.problem.groups > 1 for it in items) else "")
                + "), bias N(0,1) (fp16 values; convgen reads them as fp32)",
    }
    return build_result(
        group(items, rows, SAME), group(items, rows, FUSED), group(items, rows, RESIDUAL),
        reference={"gemm_tflops": REFERENCE_TFLOPS, "copy_gbps": REFERENCE_GBPS, "source": REFERENCE_SOURCE},
        launch_floor=launch,
        date=now.strftime("%Y-%m-%d"), timestamp=now.isoformat(timespec="seconds"), git=git,
        gpu=env["gpu"], versions=env["versions"], settings=settings, ceilings=ceilings,
        host_overhead_us=host, notes=notes,
    )
