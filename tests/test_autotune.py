"""Tuning on first use without a GPU: the switch (function and environment variable), the
winner's selection and skip reasons on measured rows, and the parallel compile workers
(NVRTC needs no GPU).  The GPU run itself is tests/test_autotune_gpu.py."""

from __future__ import annotations

import math
import time

import pytest

import convgen
from convgen import autotune
from convgen.candidates import candidates
from convgen.ir import ConvProblem, Pass, Target

PROBLEM = ConvProblem(16, 16, 32, 64, 3, 3, 1, 1, 1, n=8)
PLANS = candidates(PROBLEM, Pass.FPROP, Target("sm_90"))[:4]


@pytest.fixture(autouse=True)
def _no_override():
    autotune.set_autotune(None)
    yield
    autotune.set_autotune(None)


def test_autotune_is_off_by_default_and_follows_the_environment(monkeypatch):
    monkeypatch.delenv("CONVGEN_AUTOTUNE", raising=False)
    assert autotune.enabled() is False
    monkeypatch.setenv("CONVGEN_AUTOTUNE", "1")
    assert autotune.enabled() is True
    monkeypatch.setenv("CONVGEN_AUTOTUNE", "off")
    assert autotune.enabled() is False


def test_set_autotune_overrides_the_environment_until_reset(monkeypatch):
    monkeypatch.setenv("CONVGEN_AUTOTUNE", "0")
    convgen.set_autotune(True)
    assert autotune.enabled() is True
    monkeypatch.setenv("CONVGEN_AUTOTUNE", "1")
    convgen.set_autotune(False)
    assert autotune.enabled() is False
    convgen.set_autotune(None)
    assert autotune.enabled() is True


def test_plan_only_turns_autotune_off(monkeypatch):
    convgen.set_autotune(True)
    monkeypatch.setenv("CONVGEN_TUNED", "0")
    assert autotune.enabled() is False


def test_set_autotune_refuses_a_non_bool():
    with pytest.raises(TypeError, match="enabled"):
        convgen.set_autotune(1)


def M(i, us=math.inf, err=0.0, skip=None):
    return autotune.Measured(PLANS[i], us, err, skip)


def test_the_fastest_matching_candidate_wins():
    best, skipped = autotune.select([M(0, 10.0), M(1, 8.0, 1e-3), M(2, 6.0, 2e-3), M(3, 9.0)])
    assert best.plan == PLANS[2] and skipped == []


def test_the_default_wins_when_no_candidate_is_faster():
    best, skipped = autotune.select([M(0, 5.0), M(1, 8.0), M(2, 6.0)])
    assert best.plan == PLANS[0] and skipped == []


def test_a_faster_candidate_that_disagrees_or_was_not_timed_is_skipped_with_its_reason():
    rows = [M(0, 10.0), M(1, 1.0, 0.5), M(2, 1.0, math.inf), M(3, skip="compile failed: NVRTC says no")]
    best, skipped = autotune.select(rows)
    assert best.plan == PLANS[0]
    assert len(skipped) == 3
    assert "relative error 0.5" in skipped[0][1] and skipped[0][0] == PLANS[1]
    assert "not finite" in skipped[1][1]
    assert skipped[2] == (PLANS[3], "compile failed: NVRTC says no")


def test_selection_needs_the_default_measured():
    with pytest.raises(ValueError, match="default plan"):
        autotune.select([M(0, skip="compile failed"), M(1, 1.0)])


GOOD = 'extern "C" __global__ void convgen_autotune_test_ok(float* p) { p[threadIdx.x] = %d.0f; }'
BAD = 'extern "C" __global__ void convgen_autotune_test_bad(float* p) { p[threadIdx.x] = undeclared; }'


def test_parallel_compiles_report_failures_and_the_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(tmp_path))
    salt = time.time_ns() % 100000  # a source no cache has seen
    sources = [(GOOD % salt, "sm_90"), (BAD, "sm_90"), None]
    out = autotune._compile_all(sources, time.perf_counter() + 120)
    assert out[0] is None, out
    assert out[1] is not None and out[1].startswith("compile failed") and "NVRTC" in out[1], out
    assert out[2] == "could not be emitted"
    assert len(list(tmp_path.rglob("*"))) > 0  # the compile warmed this cache directory
    # Past the deadline a candidate's compile is not waited for (it takes longer than no time
    # at all); the default's (index 0) always is, as the first call above shows.
    late = autotune._compile_all([None, (GOOD % (salt + 1), "sm_90")], time.perf_counter())
    assert late[1] == "still compiling when the tuning budget ran out", late


class _FakeGpu:
    """Stands in for compile, launch and timing: outputs and times per candidate index."""

    def __init__(self, monkeypatch, plans, times, scale, compile_errors=None):
        import numpy as np

        from convgen import runtime

        self.plans, self.last = plans, None
        ref = np.random.default_rng(1).standard_normal((8, 16, 16, 64))
        monkeypatch.setattr(autotune, "_compile_all", lambda sources, deadline: [
            (compile_errors or {}).get(i) for i in range(len(sources))])

        def runner(problem, pass_, epilogue, in_dtype):
            def run(p):
                self.last = plans.index(p)
                return ref * scale.get(self.last, 1.0)
            return run

        def gpu_times(fns, reps):  # each fn runs its candidate, as the real one's launches do
            out = []
            for fn in fns:
                fn()
                out.append(times[self.last])
            return out

        monkeypatch.setattr(autotune, "_capturing", lambda: False)
        monkeypatch.setattr(autotune, "_runner", runner)
        monkeypatch.setattr(runtime, "kernels_for", lambda p: [type("K", (), {"local_bytes": 0})()])
        monkeypatch.setattr(autotune, "_gpu_times", gpu_times)


def _tune(monkeypatch, tmp_path):
    from convgen.ir import Epilogue

    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(tmp_path))
    return autotune.tune(PROBLEM, Pass.FPROP, Epilogue(bias=True), "float16", Target("sm_90"), "Fake GPU 1")


def test_tune_records_the_winner_and_a_fresh_lookup_reads_it_back(monkeypatch, tmp_path, caplog):
    import logging

    from convgen import tuning_db

    plans = candidates(PROBLEM, Pass.FPROP, Target("sm_90"))[:autotune.CANDIDATES]
    assert len(plans) == autotune.CANDIDATES
    times = {i: 10.0 - i for i in range(len(plans))}  # the last is fastest ...
    _FakeGpu(monkeypatch, plans, times, scale={len(plans) - 1: 1.5},  # ... but wrong
             compile_errors={len(plans) - 2: "compile failed: boom"})
    with caplog.at_level(logging.INFO, logger="convgen.autotune"):
        got = _tune(monkeypatch, tmp_path)
    want = plans[len(plans) - 3]  # the fastest that compiled and agrees with the default
    assert got is not None and got.as_dict() == want.as_dict()
    db = tuning_db.read_db(tmp_path / "tuning.json")
    key = tuning_db.tune_key(PROBLEM.geometry, Pass.FPROP, "float16", "sm_90")
    entry = db["gpus"]["fake-gpu-1"][key]
    assert entry["plan"] == want.as_dict() and entry["pass"] == "fprop" and entry["shape"] == PROBLEM.as_dict()
    assert (entry["us"], entry["default_us"]) == (times[len(plans) - 3], times[0])
    assert entry["default_plan"] == plans[0].as_dict()  # what the winner was timed against
    tuning_db._loaded.clear()  # as a new process would read it
    again = tuning_db.tuned_plan("Fake GPU 1", PROBLEM, Pass.FPROP, "float16", Target("sm_90"))
    assert again is not None and again.as_dict() == want.as_dict()
    text = caplog.text
    assert "compile failed: boom" in text and "disagrees with the default plan" in text
    assert "tuned fprop" in text


def test_tune_stops_timing_when_the_budget_is_spent(monkeypatch, tmp_path, caplog):
    import logging

    plans = candidates(PROBLEM, Pass.FPROP, Target("sm_90"))[:autotune.CANDIDATES]
    _FakeGpu(monkeypatch, plans, {i: 10.0 - i for i in range(len(plans))}, scale={})
    monkeypatch.setattr(autotune, "BUDGET_S", 0.0)
    with caplog.at_level(logging.INFO, logger="convgen.autotune"):
        got = _tune(monkeypatch, tmp_path)
    assert got is not None and got.as_dict() == plans[0].as_dict()  # only the default was timed
    assert caplog.text.count("the tuning budget ran out") == len(plans) - 1


def test_a_default_that_fails_to_compile_leaves_the_call_to_the_planner(monkeypatch, tmp_path, caplog):
    plans = candidates(PROBLEM, Pass.FPROP, Target("sm_90"))[:autotune.CANDIDATES]
    _FakeGpu(monkeypatch, plans, {i: 1.0 for i in range(len(plans))}, scale={},
             compile_errors={0: "compile failed: boom"})
    assert _tune(monkeypatch, tmp_path) is None
    assert not (tmp_path / "tuning.json").exists() and "untuned" in caplog.text


def test_no_tuning_while_a_cuda_graph_is_being_captured(monkeypatch, tmp_path, caplog):
    import logging

    plans = candidates(PROBLEM, Pass.FPROP, Target("sm_90"))[:autotune.CANDIDATES]
    _FakeGpu(monkeypatch, plans, {i: 1.0 for i in range(len(plans))}, scale={})
    monkeypatch.setattr(autotune, "_capturing", lambda: True)
    with caplog.at_level(logging.INFO, logger="convgen.autotune"):
        assert _tune(monkeypatch, tmp_path) is None
    assert not (tmp_path / "tuning.json").exists() and "capturing" in caplog.text


@pytest.mark.parametrize("pass_", list(Pass), ids=lambda p: p.value)
def test_runner_calls_the_grouped_convolution_it_tunes(pass_, monkeypatch):
    """The tuner times each candidate through convgen's own front end on arrays of the
    problem's shapes.  It must describe the grouping too: w holds C / G channels, so a call
    without groups is refused by the front end's channel check (this happened: every grouped
    first call fell back untuned on the H200).  The front end is recorded, not run (no GPU)."""
    import cupy
    import numpy as np

    from convgen import runtime
    from convgen.ir import Epilogue

    problem = ConvProblem(10, 10, 32, 48, 3, 3, 1, 1, 1, 4, n=2)
    calls = []

    def front(name, first, second, third, kwargs):
        w_shape = second.shape if name != "wgrad" else tuple(third)
        c = first.shape[3] if name != "dgrad" else third[3]
        runtime._check_group_channels(w_shape[3], c, kwargs.get("groups", 1), "w", "x")
        calls.append((name, kwargs))

    monkeypatch.setattr(cupy, "asarray", np.asarray)
    monkeypatch.setattr(runtime, "conv2d", lambda x, w, b=None, **kw: front("fprop", x, w, None, kw))
    monkeypatch.setattr(runtime, "conv2d_dgrad", lambda dy, w, shape, **kw: front("dgrad", dy, w, shape, kw))
    monkeypatch.setattr(runtime, "conv2d_wgrad", lambda x, dy, shape, **kw: front("wgrad", x, dy, shape, kw))
    run = autotune._runner(problem, pass_, Epilogue(), "float16")
    run(None)
    assert [name for name, _ in calls] == [pass_.value]


def test_depthwise_layers_are_tuned_on_first_use_in_every_pass(monkeypatch):
    """A depthwise layer's first use times its kind's variations in all three passes (fprop
    and dgrad measured on the H200, wgrad on an H100): each pass reaches compilation with more
    than one candidate."""
    from convgen.ir import Epilogue

    reached = []

    def no_gpu(sources, deadline):
        reached.append(len(sources))
        raise RuntimeError("no GPU here")

    monkeypatch.setattr(autotune, "_compile_all", no_gpu)
    monkeypatch.setattr(autotune, "_capturing", lambda: False)
    layer = ConvProblem(56, 56, 144, 144, 3, 3, 1, 1, groups=144, n=8)
    for pass_ in (Pass.FPROP, Pass.DGRAD, Pass.WGRAD):
        with pytest.raises(RuntimeError, match="no GPU here"):
            autotune.tune(layer, pass_, Epilogue(bias=False), "float16", Target("sm_90"), "NVIDIA H200")
    assert reached == [autotune.CANDIDATES] * 3


def test_a_packed_grouped_wgrad_is_tuned_through_the_layers_own_call(monkeypatch, tmp_path):
    """A grouped wgrad whose groups run packed (ResNeXt's) runs a kernel that stores each
    filter's own channels (KernelSpec.pack).  Tuning on first use must time that kernel: each
    candidate is compiled with the pack and run through the layer's own call, with no hand plan
    (a hand plan would run the slabs as a layer of their own, storing all of their dW), pinned
    as the slabs' plan; the winner is recorded under the slabs' shape, which the op looks up."""
    import os

    import numpy as np

    from convgen import group_pack, runtime, tuning_db
    from convgen.ir import Epilogue

    target = Target("sm_90", 132)
    layer = ConvProblem(8, 8, 128, 128, 3, 3, 1, 1, 1, groups=32, n=2)
    slabs = group_pack.kernel_problem(layer, Pass.WGRAD, "float16", target)
    pack = layer.groups // slabs.groups
    assert pack > 1
    plans = candidates(slabs, Pass.WGRAD, target, "float16")[:autotune.CANDIDATES]
    compiled, calls = [], []

    def compile_all(sources, deadline):
        compiled.extend(sources)
        return [None] * len(sources)

    def fake_wgrad(x, dy, w_shape, bias=True, plan=None, **kw):
        pinned = tuning_db.tuned_plan("NVIDIA H200", slabs, Pass.WGRAD, "float16", target)
        calls.append((tuple(w_shape), kw.get("groups"), plan, os.environ.get("CONVGEN_TUNED"), pinned))
        return np.full(w_shape, 1.0), None

    import cupy

    monkeypatch.setattr(cupy, "asarray", np.asarray)  # no GPU: the arrays stay on the host
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CONVGEN_TUNED", raising=False)
    monkeypatch.setattr(autotune, "_compile_all", compile_all)
    monkeypatch.setattr(autotune, "_capturing", lambda: False)
    monkeypatch.setattr(autotune, "_as_host", lambda out: [np.asarray(out[0])])
    monkeypatch.setattr(autotune, "_gpu_times", lambda fns, reps: [
        10.0 - plans.index(calls[-1][4]) if fn() else 0 for fn in fns])
    monkeypatch.setattr(runtime, "conv2d_wgrad", fake_wgrad)
    monkeypatch.setattr(runtime, "kernels_for", lambda p: [type("K", (), {"local_bytes": 0})()])
    got = autotune.tune(slabs, Pass.WGRAD, Epilogue(bias=False), "float16", target, "NVIDIA H200", layer=layer)
    assert len(compiled) == len(plans) and all(f"x{pack}_" in src for src, _ in compiled)  # the op's kernels
    assert {c[:4] for c in calls} == {(layer.w_shape, layer.groups, None, "0")}  # its own call, databases out
    assert [c[4] for c in calls] == plans + plans  # each candidate pinned: run and checked, then timed
    assert got is not None and got.as_dict() == plans[-1].as_dict()  # the fastest, under the slabs' shape
    assert not tuning_db._pinned and "CONVGEN_TUNED" not in os.environ


def test_candidates_are_timed_in_turns_each_behind_a_spin_and_an_l2_flush(monkeypatch, caplog):
    """_gpu_times on a stand-in CuPy that logs what reaches the stream: rep by rep every
    candidate, each launch bracketed by its own events after a spin and a flush that writes
    twice the GPU's L2 (what `convgen tune` and `convgen bench` do), and each candidate's
    median over its own reps."""
    import sys
    import types

    log: list = []
    elapsed = iter(range(1, 1000))

    class Event:
        def record(self, stream=None):
            log.append("event")

        def synchronize(self):
            pass

    class Buffer:
        def __init__(self, nbytes):
            self.nbytes = nbytes

        def fill(self, v):
            log.append(("flush", self.nbytes))

    runtime = types.SimpleNamespace(cudaDevAttrClockRate=1, cudaDevAttrL2CacheSize=2,
                                    deviceGetAttribute=lambda attr, dev: {1: 1_500_000, 2: 50 << 20}[attr])
    cuda = types.SimpleNamespace(
        Device=lambda: types.SimpleNamespace(id=0), Event=Event, runtime=runtime,
        memory=types.SimpleNamespace(OutOfMemoryError=MemoryError),
        get_current_stream=lambda: types.SimpleNamespace(synchronize=lambda: None),
        get_elapsed_time=lambda a, b: next(elapsed) / 1000.0)
    fake = types.SimpleNamespace(cuda=cuda, int64=int, uint8="uint8",
                                 RawKernel=lambda src, name: (lambda grid, block, args: log.append("spin")),
                                 empty=lambda n, dtype: Buffer(n))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    times = autotune._gpu_times([lambda: log.append("A"), lambda: log.append("B")], 3)
    assert log == ["spin", ("flush", 100 << 20), "event", "A", "event",
                   "spin", ("flush", 100 << 20), "event", "B", "event"] * 3
    # elapsed times come out in the order the medians read them: A's reps 1, 2, 3 us, then B's 4, 5, 6
    assert times == [2.0, 5.0]

    # A GPU too full for the flush's buffer: the candidates are still timed, without it, and the log says so
    class OutOfMemoryError(Exception):
        pass

    def no_room(n, dtype):
        raise OutOfMemoryError(n)

    cuda.memory = types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError)
    fake.empty = no_room
    log.clear()
    assert autotune._gpu_times([lambda: log.append("A")], 2) == [7.5]
    assert log == ["spin", "event", "A", "event"] * 2
    assert "no memory for the L2 flush" in caplog.text


@pytest.mark.parametrize("c,k", [(96, 32), (80, 16), (48, 64)])
def test_the_tuner_offers_halo_tiles_exactly_as_wide_as_an_n_of_whole_fragments_but_no_power_of_two(c, k):
    """dgrad's N is C.  UNet's dec1-cat96 (N = 96) had only tiles of 128 (a quarter of the
    columns padding) or of 32 and 64 (the halo staged two or three times per output pixel);
    the tuner now offers tiles exactly N wide on every in-place halo layout."""
    problem = ConvProblem(64, 64, c, k, 3, 3, 1, 1, 1, n=2)
    halo = [p for p in candidates(problem, Pass.DGRAD, Target("sm_90")) if p.halo]
    exact = {type(p.loop).__name__ + str(getattr(p.loop, "tile_w", "")) for p in halo if p.block_n == c}
    assert exact == {"HaloTile16", "HaloTile32", "FlatHalo"}, exact
