"""`convgen bench`'s timing loops and a row's harness on a fake device, whose clock only the
work enqueued on it moves, so that every figure the loops report is known exactly: the
interleaved loop with its flush and its events around the op alone, the host and eager costs
per call, a row's three figures on both sides, and run_bench's orchestration end to end,
which is what the GPU run goes through, less the kernels."""

from __future__ import annotations

import json
import sys

import pytest

from convgen.tools import timing
from convgen.tools.bench import command, harness, report, rows
from convgen.ir import Pass, Target
from convgen.suites import Layer

from test_bench import CEILINGS, PROB, FakeDevice, _args  # the bench tests' fake device and stand-ins


# --------------------------------------------------------------------------- timing loops (fake device)


def test_time_interleaved_abab_flush_and_events_around_op_only():
    dev = FakeDevice()
    out = timing.time_interleaved(dev, [("A", dev.op("A", 5.0)), ("B", dev.op("B", 7.0))], 3, spin_us=20.0,
                                 head_start_us=100.0)
    assert out == {"A": [5.0] * 3, "B": [7.0] * 3}
    body = dev.log[dev.log.index("spin100") + 1:-1]
    assert dev.log[0] == "sync" and dev.log[-1] == "sync"
    assert body == ["spin20", "flush", "record", "A", "record", "spin20", "flush", "record", "B", "record"] * 3


def test_time_interleaved_without_flush():
    dev = FakeDevice()
    out = timing.time_interleaved(dev, [("G", dev.op("G", 3.0))], 2, flush=False, spin_us=0.0)
    assert out == {"G": [3.0, 3.0]} and "flush" not in dev.log


def test_host_overhead_per_call():
    dev = FakeDevice()
    clock = {"t": 0.0}

    def fn():  # 4 us of host time per call
        clock["t"] += 4e-6

    us, clean = timing.host_overhead(dev, fn, 50, clock=lambda: clock["t"])
    assert us == pytest.approx(4.0) and clean is True
    spins = [e for e in dev.log if e.startswith("spin")]
    assert spins == ["spin1000"]  # at least 1 ms of spin in front of the calls


class AsyncDevice(FakeDevice):
    """A GPU that runs behind the host: a call costs `host` us of the host's clock and queues
    `gpu` us of work; sync waits for the queue.  What a user's eager loop meets."""

    def __init__(self, host, gpu):
        super().__init__()
        self.host, self.gpu, self.now, self.free_at = host, gpu, 0.0, 0.0

    def sync(self):
        self.now = max(self.now, self.free_at)

    def clock(self):
        return self.now * 1e-6

    def call(self):
        self.now += self.host
        self.free_at = max(self.free_at, self.now) + self.gpu


@pytest.mark.parametrize("host, gpu, expect", [(5.0, 20.0, 20.0), (30.0, 10.0, 30.0)])
def test_eager_time_is_the_larger_of_host_and_gpu_per_call(host, gpu, expect):
    dev = AsyncDevice(host, gpu)
    per_call = timing.eager_per_call(dev, dev.call, 100, clock=dev.clock)
    assert per_call == pytest.approx(expect, rel=0.02)  # within the first call's latency


def test_eager_interleaved_alternates_the_sides():
    dev = FakeDevice()
    out = timing.eager_interleaved(dev, [("A", dev.op("A", 1.0)), ("B", dev.op("B", 1.0))], calls=2, trials=3,
                                   clock=lambda: 0.0)
    assert [e for e in dev.log if e in "AB"] == ["A", "A", "B", "B"] * 3
    assert {k: len(v) for k, v in out.items()} == {"A": 3, "B": 3}


# --------------------------------------------------------------------------- a row's harness


class RowSession(harness.Session):
    """The harness's row logic on a fake device: each side is an op of known GPU time."""

    def ops(self, problem, pass_, d, variant="same"):
        def side(name, us):
            op = self.dev.op(name, us)

            def fn():
                op()
                return name  # an output, so the two sides get compared
            return fn
        return side("convgen", 7.0), (side("cudnn", 11.0) if self.torch is not None else None)

    def compare(self, pass_, cg_out, cd_out):
        return {"rel_err": 1e-4, "parts": {}, "tol": rows.TOLERANCE, "ok": True}


def test_run_row_fills_the_three_figures_of_both_sides():
    dev = FakeDevice()
    dev.empty = dev.op("empty", 0.0)
    args = _args(["--suite", "cifar-vgg", "--reps", "4", "--eager-calls", "3", "--eager-trials", "2", "--host-calls", "5"])
    session = RowSession(None, object(), dev, Target("sm_90", 132), args)
    item = rows.Item("s", Layer("l", PROB), Pass.FPROP)
    row = rows.new_row(item, target=None, with_cudnn=True)
    session.run_row(item, row, {"x": 1}, 0, None)
    rows.finish_row(row, CEILINGS)
    for side, us in (("convgen", 7.0), ("cudnn", 11.0)):
        r = row[side]
        assert r["time_us"]["median"] == pytest.approx(us) and r["time_us"]["n"] == 4, side
        assert r["eager_us"]["n"] == 2 and r["eager_us"]["median"] >= 0.0
        assert r["host_us"] is not None and r["host_clean"] is True
        assert r["error"] is None
    assert row["speedup"] == pytest.approx(11.0 / 7.0) and row["check"]["ok"] is True
    assert row["cudnn"]["first_call_ms"] is not None and row["spin_us"] >= timing.MIN_SPIN_US
    assert dev.log.count("convgen") == args.warmup + 3 + 5 + 4 + 2 * 3  # warm-up, host probe + calls, reps, eager
    floor = session.launch_floor(10)
    assert floor["host_us"] is not None and floor["error"] is None and "empty" in dev.log


def test_run_row_without_eager_leaves_it_null():
    dev = FakeDevice()
    args = _args(["--suite", "cifar-vgg", "--reps", "2", "--eager-calls", "0", "--host-calls", "0"])
    session = RowSession(None, object(), dev, Target("sm_90", 132), args)
    item = rows.Item("s", Layer("l", PROB), Pass.WGRAD)
    row = rows.new_row(item, target=None, with_cudnn=True)
    session.run_row(item, row, {"x": 1}, 0, None)
    assert row["convgen"]["eager_us"] is None and row["convgen"]["time_us"]["n"] == 2
    assert row["spin_us"] == 100.0  # host cost not measured: the generous spin


def test_run_bench_end_to_end_on_a_fake_gpu(monkeypatch, tmp_path):
    """run_bench's orchestration (stream, device, ceilings, launch floor, one data set per
    layer, rows of both variants, settings, grouping) with CuPy, the device and the session's
    GPU calls faked: what the H200 run goes through, minus the kernels."""
    import contextlib
    from types import SimpleNamespace

    import convgen.compile
    import convgen.runtime

    dev = FakeDevice()
    dev.empty = dev.op("empty", 0.0)
    dev.recalibrate = lambda: None
    dev.cycles_per_us = 1980.0
    fake_cupy = SimpleNamespace(cuda=SimpleNamespace(Stream=SimpleNamespace(null=contextlib.nullcontext()),
                                                     Device=lambda *a: SimpleNamespace(id=0)))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setattr(convgen.compile, "detect_target", lambda: Target("sm_90", 132))
    monkeypatch.setattr(convgen.runtime, "_gpu_name", lambda i: "NVIDIA H200")
    monkeypatch.setattr(harness, "CudaDevice", lambda cp, stream: dev)
    monkeypatch.setattr(harness, "_environment", lambda cp, torch, target: {
        "gpu": {"name": "NVIDIA H200", "arch": target.arch, "sm_count": target.sm_count}, "versions": {}})
    monkeypatch.setattr(harness.Session, "ceilings", lambda self: {"gemm_tflops": 700.0, "copy_gbps": 4000.0})
    made = []
    monkeypatch.setattr(harness.Session, "make_data", lambda self, problem, seed: made.append(problem) or {"x": 1})
    monkeypatch.setattr(harness.Session, "ops", RowSession.ops)
    monkeypatch.setattr(harness.Session, "compare", RowSession.compare)
    args = _args(["--suite", "cifar-resnet", "--layers", "conv1,res3", "--fused", "--no-torch", "--no-compile-time",
                  "--no-progress", "--reps", "3", "--eager-calls", "2", "--eager-trials", "2", "--host-calls", "4"])
    suites, items = command.resolve_items(args)
    result = harness.run_bench(args, suites, items)
    assert len(made) == 2  # one data set per layer, shared by its passes and variants
    assert [r["pass"] for r in result["suites"][0]["rows"]] == ["fprop", "dgrad", "wgrad"] * 2
    assert [(r["layer"], r["pass"]) for r in result["fused"]["suites"][0]["rows"]] == [
        ("conv1", "fprop"), ("conv1", "wgrad"), ("res3", "fprop"), ("res3", "wgrad")]
    row = result["suites"][0]["rows"][0]
    assert row["convgen"]["time_us"]["median"] == pytest.approx(7.0) and row["convgen"]["eager_us"]["n"] == 2
    assert row["cudnn"] is None and row["variant"] == "same" and "bias" not in row["traffic"]
    assert row["convgen"]["plan"] is not None  # the tuned H200 plan it would run
    assert result["launch_floor"]["host_us"] is not None and result["launch_floor"]["calls"] == 100
    assert result["settings"]["fused"] is True and result["settings"]["eager_calls"] == 2
    assert result["reference"]["gemm_tflops"] == 781.0 and result["format"] == report.RESULT_FORMAT
    path = report.write_json(result, tmp_path, "r.json")
    assert json.loads(path.read_text())["fused"]["summary"]["count"]["all"] == 0  # no cuDNN side: no speedups
    assert "launch floor" in report.format_report(result)
    assert result["settings"]["plans"] == rows.plans_setting()
    assert f"convgen's plans: {rows.plans_setting()}" in report.format_report(result)
    # with tuning on first use, a row whose shape no database covers names the plan its calls ran
    ran = {"block_m": 999}
    monkeypatch.setattr(harness, "plan_run", lambda it: ran)
    monkeypatch.setattr(convgen.runtime, "_gpu_name", lambda i: "Some Other GPU")
    convgen.set_autotune(True)
    try:
        tuned = harness.run_bench(args, suites, items)
    finally:
        convgen.set_autotune(None)
    assert all(r["convgen"]["plan_source"] == "first use" and r["convgen"]["plan"] is ran
               for r in tuned["suites"][0]["rows"])
    assert all(r["convgen"]["plan"] is not ran for r in result["suites"][0]["rows"])
