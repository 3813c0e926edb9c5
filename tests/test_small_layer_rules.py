"""convgen.small_layer_rules: the planner's rules for small layers hold to the tuning data
they were fitted to (convgen/tuning/nvidia-h200.json), and leave other layers alone."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from convgen.ir import ConvProblem, Pass, Target
from convgen.mainloop import HaloLdsm, HaloTile, Im2col, StagedHalo
from convgen.planner import check_plan, plan
from convgen.suites import SUITES

H200 = Target("sm_90", 132)
DB = json.loads((Path(__file__).resolve().parent.parent / "convgen" / "tuning" / "nvidia-h200.json").read_text())
ENTRIES = list(DB["gpus"]["nvidia-h200"].values())


def _problem(e: dict) -> ConvProblem:
    s = e["shape"]
    return ConvProblem(s["h"], s["w"], s["c"], s["k"], s["r"], s["s"], tuple(s["stride"]), tuple(s["padding"]),
                       tuple(s["dilation"]), n=s["n"])


def _blocks(problem: ConvProblem, pass_: Pass, block_m: int, block_n: int, split: int) -> int:
    g = problem.gemm(pass_)
    return math.ceil(g.m / block_m) * math.ceil(g.n / block_n) * split


WGRAD_SPLIT = [e for e in ENTRIES if e["pass"] == "wgrad" and not e["plan"].get("tma") and e["plan"]["split_k"] > 1]


@pytest.mark.parametrize("entry", WGRAD_SPLIT, ids=lambda e: f"C{e['shape']['c']}K{e['shape']['k']}_{e['shape']['h']}px")
def test_wgrad_split_launches_about_the_tuned_blocks(entry, monkeypatch):
    """The default split launches within 2.5x the blocks of the tuned winner (the older one
    block per SM was up to 4x short on one-tile layers), and keeps >= 4 K-steps a slice."""
    monkeypatch.setenv("CONVGEN_TUNED", "0")
    p = _problem(entry)
    d, t = plan(p, Pass.WGRAD, H200), entry["plan"]
    if d.tma:
        pytest.skip("the TMA loop's default (C a multiple of 64) splits by its own cost model")
    assert isinstance(d.loop, Im2col) and d.split_k > 1
    ours = _blocks(p, Pass.WGRAD, d.block_m, d.block_n, d.split_k)
    tuned = _blocks(p, Pass.WGRAD, t["block_m"], t["block_n"], t["split_k"])
    assert tuned / 2.5 <= ours <= tuned * 2.5, (ours, tuned)
    assert math.ceil(p.gemm(Pass.WGRAD).k / d.block_k) // d.split_k >= 4
    assert any("resident blocks each" in r for r in d.reasons)


def test_fprop_and_dgrad_splits_keep_one_block_per_sm():
    p = ConvProblem(7, 7, 2048, 16, 1, 1, 1, 0, 1, n=1)  # 49 pixels x 16 filters: one tile
    d = plan(p, Pass.FPROP, H200)
    assert d.split_k <= H200.sm_count and not any("resident blocks" in r for r in d.reasons)


HALO_TUNED = [e for e in ENTRIES if e["pass"] in ("fprop", "dgrad") and e["plan"].get("tile_w")
              and (e["shape"]["w"] <= 32)]


@pytest.mark.parametrize("entry", HALO_TUNED, ids=lambda e: f"{e['pass']}_C{e['shape']['c']}K{e['shape']['k']}_{e['shape']['h']}px")
def test_small_images_default_to_the_halo_path_their_tuned_plans_took(entry, monkeypatch):
    """Every tuned small-image fprop and dgrad on the H200 won on a halo plan; the default
    takes one of the same width (16, or ldmatrix 8 on 8-pixel images), unless the TMA loop
    runs the layer (>= 8 K-steps), and it is a plan the checker accepts."""
    monkeypatch.setenv("CONVGEN_TUNED", "0")
    p, pass_ = _problem(entry), Pass.parse(entry["pass"])
    d = plan(p, pass_, H200)
    if d.tma:
        pytest.skip("the TMA loop's default comes first (its own probe-fitted rule)")
    assert isinstance(d.loop, (HaloTile, HaloLdsm, StagedHalo)), d.brief()
    assert d.loop.tile_w == (8 if entry["plan"]["tile_w"] == 8 else 16)
    check_plan(d, p, pass_, H200, "float16")
    assert any("halo path" in r for r in d.reasons)


def test_the_halo_rule_leaves_other_layers_alone(monkeypatch):
    """Wider images, N > 64, strides, 1x1 filters, wgrad and non-CUDA targets keep their plans."""
    monkeypatch.setenv("CONVGEN_TUNED", "0")
    cases = [
        (ConvProblem(56, 56, 32, 32, 3, 3, 1, 1, 1, n=8), Pass.FPROP, H200),    # 56 pixels wide
        (ConvProblem(16, 16, 32, 96, 3, 3, 1, 1, 1, n=8), Pass.FPROP, H200),    # N = K = 96
        (ConvProblem(32, 32, 32, 32, 3, 3, 2, 1, 1, n=8), Pass.FPROP, H200),    # stride 2
        (ConvProblem(32, 32, 32, 32, 1, 1, 1, 0, 1, n=8), Pass.FPROP, H200),    # 1x1
        (ConvProblem(32, 32, 32, 32, 3, 3, 1, 1, 1, n=8), Pass.WGRAD, H200),
        (ConvProblem(32, 32, 32, 32, 3, 3, 1, 1, 1, n=8), Pass.FPROP, Target("gfx942")),
    ]
    for p, pass_, target in cases:
        assert not plan(p, pass_, target).loop.halo, (p.describe(), pass_)


def test_real_network_suites_keep_their_plans(monkeypatch):
    """The rule was fitted to CIFAR-sized images: no layer of the real-network suites meets it."""
    monkeypatch.setenv("CONVGEN_TUNED", "0")
    for suite, layers in SUITES.items():
        if suite.startswith("cifar"):
            continue
        for layer in layers:
            for pass_ in (Pass.FPROP, Pass.DGRAD):
                assert not plan(layer.problem, pass_, H200).loop.halo, (suite, layer.name, pass_)
