"""convgen tune's runs without a GPU: the tuning database (its round trip and lookup order, stale
and corrupt entries, the shipped H200 database), the timing glue against bench's fake device,
the command's exits, what a layer's timed calls compute, a tune stopped partway, and a
candidate that fails to launch.  A suite's tuning takes minutes on a GPU and its database is
what convgen.conv2d runs, so what it measured must survive a stop, a broken candidate must cost
its row and not the run, and an entry must not be used once the default it beat is no longer
the planner's."""

from __future__ import annotations

import dataclasses
import json

import pytest

from convgen import tuning_db
from convgen.tools import timing, tune
from convgen.cli import main
from convgen.ir import ConvProblem, Pass, Target
from convgen.spec import Plan
from convgen.planner import check_plan, plan
from convgen.suites import SUITES, TUNED_ON

from test_bench import FakeDevice


def _db_entry(problem: ConvProblem, pass_: Pass, p: Plan) -> tuple[str, dict]:
    key = tuning_db.tune_key(problem.geometry, pass_, "float16", "sm_90")
    return key, {"plan": p.as_dict(), "us": 10.0, "default_us": 12.0, "shape": problem.as_dict(), "pass": pass_.value}


def test_database_round_trip_and_lookup_order(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tuning_db, "SHIPPED_DIR", tmp_path / "shipped")
    tuning_db._loaded.clear()
    problem = SUITES["cifar-vgg"][1].problem
    target = Target("sm_90")
    cands = tune.candidates(problem, Pass.FPROP, target)
    assert tuning_db.lookup("NVIDIA H200", problem.geometry, Pass.FPROP, "float16", "sm_90") is None

    shipped_plan, user_plan = cands[1], cands[2]
    key, entry = _db_entry(problem, Pass.FPROP, shipped_plan)
    tuning_db.record(tmp_path / "shipped" / "nvidia-h200.json", "NVIDIA H200", {key: entry})
    got = tuning_db.lookup("NVIDIA H200", problem.geometry, Pass.FPROP, "float16", "sm_90")
    assert got == shipped_plan and "tuned on NVIDIA H200" in got.reasons[0]
    # Another GPU, pass, dtype or arch does not match.
    assert tuning_db.lookup("NVIDIA A100", problem.geometry, Pass.FPROP, "float16", "sm_90") is None
    assert tuning_db.lookup("NVIDIA H200", problem.geometry, Pass.DGRAD, "float16", "sm_90") is None
    assert tuning_db.lookup("NVIDIA H200", problem.geometry, Pass.FPROP, "float32", "sm_90") is None

    # The user's own database wins over the shipped one; the write is atomic (no temp left).
    key, entry = _db_entry(problem, Pass.FPROP, user_plan)
    tuning_db.record(tuning_db.user_db_path(), "NVIDIA H200", {key: entry})
    assert tuning_db.lookup("NVIDIA H200", problem.geometry, Pass.FPROP, "float16", "sm_90") == user_plan
    assert [p.name for p in tuning_db.user_db_path().parent.iterdir() if p.name.endswith(".tmp")] == []
    data = json.loads(tuning_db.user_db_path().read_text())
    assert data["format"] == tuning_db.DB_FORMAT and key in data["gpus"]["nvidia-h200"]


def test_a_tuned_entry_is_stale_once_the_default_it_beat_is_not_the_planners(tmp_path, monkeypatch):
    """An entry that records the default plan it was timed against serves while the planner
    still picks that plan for the call's batch; an older entry without one serves only the batch
    it was tuned at.  (ResNet-50's shipped batch-64 entries ran ResNet-18's batch-128 layers up
    to 1.56x slower than the planner's plans on the H200.)"""
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CONVGEN_TUNED", raising=False)
    monkeypatch.setattr(tuning_db, "SHIPPED_DIR", tmp_path / "shipped")
    tuning_db._loaded.clear()
    target = Target("sm_90", 132)
    problem = next(l for l in SUITES["resnet50"] if l.name == "l2-3x3").problem.with_batch(64)
    default = plan(problem, Pass.FPROP, target)
    tuned = next(c for c in tune.candidates(problem, Pass.FPROP, target)[1:] if c.as_dict() != default.as_dict())
    other = next(c for c in tune.candidates(problem, Pass.FPROP, target)[1:] if c.as_dict() not in
                 (default.as_dict(), tuned.as_dict()))
    user = tuning_db.user_db_path()

    def entry_with(**extra):
        tuning_db._loaded.clear()
        key, entry = _db_entry(problem, Pass.FPROP, tuned)
        tuning_db.record(user, "NVIDIA H200", {key: {**entry, **extra}})
        return lambda p: tuning_db.tuned_plan("NVIDIA H200", p, Pass.FPROP, "float16", target)

    lookup = entry_with(default_plan=default.as_dict())
    assert lookup(problem) == tuned
    lookup = entry_with(default_plan=other.as_dict())  # timed against a plan the planner no longer picks
    assert lookup(problem) is None
    # At a batch the planner plans otherwise, the comparison does not carry over.
    small = problem.with_batch(8)  # a 64x128 tile, not the 128x128 ping-pong of batch 64
    assert plan(small, Pass.FPROP, target).as_dict() != default.as_dict()
    assert entry_with(default_plan=default.as_dict())(small) is None
    # An entry without its default plan (the shipped ones written before it was recorded).
    lookup = entry_with()
    assert lookup(problem) == tuned and lookup(problem.with_batch(128)) is None
    # Where the planner refuses the shape, the tuned plan is the only one there is.
    entry_with(default_plan=other.as_dict())

    def refused():
        raise ValueError("no plan")

    assert tuning_db.lookup("NVIDIA H200", problem.geometry, Pass.FPROP, "float16", "sm_90", batch=problem.n,
                            default=refused) == tuned
    # Tools that list a database still read every entry.
    assert tuning_db.lookup("NVIDIA H200", problem.geometry, Pass.FPROP, "float16", "sm_90") == tuned


def test_a_corrupt_database_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tuning_db, "SHIPPED_DIR", tmp_path / "none")
    tuning_db._loaded.clear()
    tuning_db.user_db_path().parent.mkdir(parents=True, exist_ok=True)
    tuning_db.user_db_path().write_text("{ not json")
    problem = SUITES["cifar-vgg"][1].problem
    assert tuning_db.lookup("NVIDIA H200", problem.geometry, Pass.FPROP, "float16", "sm_90") is None


def test_shipped_h200_database_holds_feasible_plans_for_every_suite_shape():
    tuning_db._loaded.clear()
    data = json.loads((tuning_db.SHIPPED_DIR / "nvidia-h200.json").read_text())
    entries = data["gpus"]["nvidia-h200"]
    target = Target("sm_90")
    shapes = {tuning_db.tune_key(l.problem.geometry, p, "float16", "sm_90"): (l, p)
              for suite in TUNED_ON for l in SUITES[suite] for p in Pass}  # the suites it was tuned on
    assert entries and set(entries) <= set(shapes)
    for key, entry in entries.items():  # a shape without an entry runs the planner's plan
        layer, pass_ = shapes[key]
        assert entry["shape"]["n"] == layer.problem.n and entry["pass"] == pass_.value
        check_plan(Plan.from_dict(entry["plan"], layer.problem, pass_), layer.problem, pass_, target, "float16")
        # Each entry beat the planner's plan of the day it was measured; a planner that now
        # picks another plan for the shape makes it stale (tuning_db.lookup), so the shipped
        # ones must be measured again, or dropped, with the planner change.
        assert entry["default_plan"] == plan(layer.problem, pass_, Target("sm_90", 132)).as_dict(), layer.name
        assert entry["us"] < entry["default_us"]


def test_median_gpu_us_times_only_the_op():
    dev = FakeDevice()
    us = timing.median_gpu_us(dev, dev.op("op", 7.0), reps=5)
    assert us == pytest.approx(7.0)
    assert f"spin{timing.TUNE_SPIN_US:g}" in dev.log  # tune's spin: longer than a call's host cost


def test_tune_without_a_gpu_exits_1(monkeypatch, capsys):
    from convgen import compile as cc

    def no_gpu():
        raise cc.DeviceError("no usable GPU: test")

    monkeypatch.setattr(cc, "detect_target", no_gpu)
    assert main(["tune", "--suite", "cifar-vgg", "--pass", "fprop"]) == 1
    assert main(["tune", "--suite", "cifar-vgg", "--layers", "conv2,conv3", "--pass", "fprop"]) == 1  # past the arguments
    assert "no usable CUDA GPU" in capsys.readouterr().err


@pytest.mark.parametrize("argv, msg", [
    ([], "give --suite NAME or a full shape"),
    (["--suite", "nope"], "unknown suite"),
    (["-n", "4", "-h", "16"], "missing -w"),
    (["--suite", "unet", "--layers", "enc1a,nope"], "--layers: no layer named nope"),
])
def test_tune_usage_errors_exit_2_before_looking_for_a_gpu(argv, msg, monkeypatch, capsys):
    from convgen import compile as cc

    monkeypatch.setattr(cc, "detect_target", lambda: pytest.fail("GPU probed before the arguments"))
    assert main(["tune", *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and "GPU" not in err


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("pass_", [Pass.FPROP, Pass.WGRAD], ids=lambda p: p.value)
def test_tune_times_the_bias_only_when_asked(pass_, bias, monkeypatch):
    """`convgen tune --no-bias` times what the same-work bench compares (conv(x, w), dW
    alone); by default fprop adds a bias and wgrad computes db, as it always has."""
    cp = pytest.importorskip("cupy")  # tune_layer imports it; no GPU is touched below
    from convgen import runtime
    from convgen.tools import tune

    seen = []

    class Stop(Exception):
        pass

    def fake_conv2d(x, w, b, **kw):
        seen.append(b is not None)
        raise Stop

    def fake_wgrad(x, dy, w_shape, bias=True, **kw):
        seen.append(bias)
        raise Stop

    monkeypatch.setattr(runtime, "conv2d", fake_conv2d)
    monkeypatch.setattr(runtime, "conv2d_wgrad", fake_wgrad)
    monkeypatch.setattr(tune, "candidates", lambda *a, **k: ["plan"])
    monkeypatch.setattr(cp, "asarray", lambda a: a)  # stay on the host
    with pytest.raises(Stop):
        tune.tune_layer(ConvProblem(8, 8, 16, 16, 3, 3, 1, 1, 1, n=2), pass_, None, Target("sm_90", 132), bias=bias)
    assert seen == [bias]


def test_tune_no_bias_is_a_cli_option():
    from convgen.cli import build_parser

    assert build_parser().parse_args(["tune", "--suite", "cifar-vgg", "--no-bias"]).no_bias is True
    assert build_parser().parse_args(["tune", "--suite", "cifar-vgg"]).no_bias is False


def test_a_stopped_tune_keeps_the_layers_it_measured(tmp_path):
    """`convgen tune` over a suite can run for minutes; stopped on its second layer (a time
    limit, Ctrl-C), the first layer's winner is already in the database and its timings in the
    log, and a later run merges its layers into the same database."""
    from convgen.suites import get_suite
    from convgen.tools.tune import tune_and_record

    target = Target("sm_90")
    first, second, third = get_suite("cifar-vgg")[:3]
    plans = tune.candidates(first.problem, Pass.FPROP, target)[:2]
    db, log = tmp_path / "tuning.json", tmp_path / "log.json"

    def measure(problem, pass_):
        if problem == second.problem:
            raise KeyboardInterrupt
        return [{"plan": p.as_dict(), "us": us, "ok": True, "err": 0.0, "spill_bytes": 0, "default": i == 0}
                for i, (p, us) in enumerate(zip(tune.candidates(problem, pass_, target)[:2], (20.0, 12.5)))]

    with pytest.raises(KeyboardInterrupt):
        tune_and_record([(first, Pass.FPROP), (second, Pass.FPROP)], measure, target, "NVIDIA H200", db, str(log), False)
    kept = json.loads(db.read_text())["gpus"]["nvidia-h200"]
    key = tuning_db.tune_key(first.problem.geometry, Pass.FPROP, "float16", target.arch)
    assert list(kept) == [key]
    assert kept[key]["plan"] == plans[1].as_dict() and kept[key]["us"] == 12.5 and kept[key]["default_us"] == 20.0
    assert kept[key]["default_plan"] == plans[0].as_dict()
    assert [e["layer"] for e in json.loads(log.read_text())["layers"]] == [first.name]

    tune_and_record([(third, Pass.DGRAD)], measure, target, "NVIDIA H200", db, None, False)
    assert len(json.loads(db.read_text())["gpus"]["nvidia-h200"]) == 2


@pytest.fixture
def host_runtime(monkeypatch):
    """tune_layer on the host: arrays stay NumPy, every kernel reports no local memory, and
    each timing is one call of the op (10 us).  Tests fake the runtime's functions themselves."""
    cp = pytest.importorskip("cupy")  # tune_layer imports it; no GPU is touched
    import numpy as np

    from convgen import runtime

    monkeypatch.setattr(runtime, "kernels_for", lambda p: [type("K", (), {"local_bytes": 0})()])
    monkeypatch.setattr(cp, "asarray", lambda a: a)
    monkeypatch.setattr(cp, "asnumpy", lambda a: np.asarray(a))
    monkeypatch.setattr(timing, "median_gpu_us", lambda dev, fn, reps: 10.0 if fn() is not None else 0.0)
    return runtime


def test_a_candidate_that_fails_to_launch_is_skipped_with_its_reason(tmp_path, capsys, monkeypatch, host_runtime):
    """On the H200 `convgen tune` of ResNet-50's stem wgrad stopped at a grid-reduce twin whose
    cooperative grid the GPU could not hold (runtime._check_cooperative's ValueError), and no
    layer was tuned.  Such a candidate is skipped and named; the others are timed and the best
    kept.  The default plan's own failure still stops the run (the library runs it untuned)."""
    import numpy as np

    runtime = host_runtime
    from convgen.planner import plan as default_plan
    from convgen.suites import Layer

    problem = ConvProblem(8, 8, 16, 16, 3, 3, 1, 1, 1, n=2)
    target = Target("sm_90", 132)
    base = default_plan(problem, Pass.WGRAD, target)
    grid = dataclasses.replace(base, split_k=4, split_reduce="grid")
    other = dataclasses.replace(base, stages=2)

    def fake_wgrad(x, dy, w_shape, bias=True, plan=None, **kw):
        if plan.split_reduce == "grid":
            raise ValueError("plan.split_reduce='grid' launches all 660 blocks at once, but this GPU holds 132")
        return np.ones(w_shape), None

    monkeypatch.setattr(runtime, "conv2d_wgrad", fake_wgrad)
    monkeypatch.setattr(tune, "candidates", lambda *a, **k: [base, grid, other])
    rows = tune.tune_layer(problem, Pass.WGRAD, None, target, bias=False)
    assert [r["us"] for r in rows] == [10.0, float("inf"), 10.0]
    assert "holds 132" in rows[1]["skipped"] and not rows[1]["ok"] and rows[0]["ok"] and rows[2]["ok"]

    measure = lambda problem_, pass_: rows  # noqa: E731
    layer = Layer("stem", problem)
    entries = tune.tune_and_record([(layer, Pass.WGRAD)], measure, target, "NVIDIA H200", tmp_path / "db.json",
                                   None, bias=False)
    err = capsys.readouterr().err
    assert "skipped a candidate of stem wgrad" in err and "holds 132" in err and "disagree" not in err
    assert Plan.from_dict(next(iter(entries.values()))["plan"], problem, Pass.WGRAD).split_reduce == "kernel"

    def default_fails(x, dy, w_shape, bias=True, plan=None, **kw):
        raise ValueError("the default plan's kernel failed")

    monkeypatch.setattr(runtime, "conv2d_wgrad", default_fails)
    with pytest.raises(ValueError, match="default plan's kernel"):
        tune.tune_layer(problem, Pass.WGRAD, None, target, bias=False)


def test_a_packed_grouped_wgrad_is_timed_through_the_layers_own_call(monkeypatch, host_runtime):
    """A grouped wgrad whose groups run packed (ResNeXt's) runs a kernel that stores each
    filter's own channels (KernelSpec.pack); a hand plan for the slabs would run them as a layer
    of their own, storing the slabs' whole dW.  So each candidate runs through the layer's own
    call, with no hand plan, pinned as the slabs' tuned plan while CONVGEN_TUNED=0 keeps the
    databases out, in a scratch kernel cache (the process's kernels are out of sight while a
    candidate runs, and back after); nothing stays pinned after."""
    import os

    import numpy as np

    from convgen import group_pack

    runtime = host_runtime

    target = Target("sm_90", 132)
    layer = ConvProblem(8, 8, 128, 128, 3, 3, 1, 1, 1, groups=32, n=2)
    slabs = group_pack.kernel_problem(layer, Pass.WGRAD, "float16", target)
    assert slabs.groups == 2
    base = plan(slabs, Pass.WGRAD, target)
    other = dataclasses.replace(base, stages=2 if base.stages != 2 else 3)
    calls, seen = [], []
    monkeypatch.setattr(runtime, "_cache", {("built before",): object()})

    def fake_wgrad(x, dy, w_shape, bias=True, plan=None, **kw):
        calls.append((tuple(w_shape), kw.get("groups"), plan, os.environ.get("CONVGEN_TUNED"),
                      tuning_db.tuned_plan("NVIDIA H200", slabs, Pass.WGRAD, "float16", target)))
        seen.append(("built before",) in runtime._cache)
        runtime._cache[("built by", len(calls))] = object()  # what a candidate's call builds ...
        return np.ones(w_shape), None

    monkeypatch.delenv("CONVGEN_TUNED", raising=False)
    monkeypatch.setattr(runtime, "conv2d_wgrad", fake_wgrad)
    monkeypatch.setattr(tune, "candidates", lambda *a, **k: [base, other])
    rows = tune.tune_layer(slabs, Pass.WGRAD, None, target, bias=False, layer=layer)
    assert [r["ok"] for r in rows] == [True, True]
    assert {c[:2] for c in calls} == {(layer.w_shape, 32)}  # the layer's own call: its groups and dW
    assert all(c[2] is None and c[3] == "0" for c in calls)  # no hand plan; the databases out
    assert [c[4] for c in calls] == [base, base, base, other, other]  # the reference, then each candidate run and timed
    assert seen == [False] * 5 and set(runtime._cache) == {("built before",)}  # ... is dropped after it
    assert not tuning_db._pinned and "CONVGEN_TUNED" not in os.environ

    calls.clear()
    seen.clear()
    tune.tune_layer(slabs, Pass.WGRAD, None, target, bias=False)  # no layer: the slabs as a layer, hand plans
    assert [c[2] for c in calls] == [base, base, base, other, other] and {c[1] for c in calls} == {2}
    assert seen == [True] * 5

    # a pinned plan the runtime swapped for another (a grid-reduce plan's fallback) is not timed as itself
    monkeypatch.setattr(runtime, "kernels_for", lambda p: [] if p == other else [type("K", (), {"local_bytes": 0})()])
    rows = tune.tune_layer(slabs, Pass.WGRAD, None, target, bias=False, layer=layer)
    assert rows[0]["ok"] and not rows[1]["ok"] and "another plan" in rows[1]["skipped"]
