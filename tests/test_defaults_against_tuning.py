"""Issue 16's bound on the planner, against what GPUs measured: on every suite and pass with a
whole-suite `convgen tune` log, the plan the planner picks today takes at most 1.10x the best
candidate's time as a geometric mean over the layers where the log timed it.

The logs are the latest whole-suite run of each suite and pass (benchmarks/results/tuning/,
named GPU_date_commit), listed here by hand: a later log of the same suite and pass replaces
its entry.  A planner change that moves a default onto a plan those runs timed slower fails
here; one that moves it onto plans no run timed shows as fewer layers timed, which must stay
at least half the suite (else the log no longer says anything about today's defaults, and the
suite wants tuning again).  The rules' own tests (test_*_rules.py, test_stream_k.py) check
each rule against the runs it was fitted to; this one keeps every suite's sum in view."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from convgen.ir import Pass, Target
from convgen.planner import plan

from test_short_reduction_rules import _problem

TUNING = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "tuning"
H200 = Target("sm_90", 132)  # the planner's sm_90 part (the H100 has 132 SMs too)

# (suite, pass) -> its latest whole-suite log
LATEST = {
    ("mobilenetv2-dw", "fprop"): "nvidia-h200_2026-12-05_e4aaee5-tune-mobilenetv2-dw-fprop.json",
    ("mobilenetv2-dw", "dgrad"): "nvidia-h200_2026-12-05_e4aaee5-tune-mobilenetv2-dw-dgrad.json",
    ("mobilenetv2-dw", "wgrad"): "nvidia-h100_2026-12-07_e89f18f-tune-mobilenetv2-dw-wgrad.json",
    ("convnext-dw", "fprop"): "nvidia-h100_2026-12-07_ed9a6e2-tune-convnext-dw-fprop.json",
    ("convnext-dw", "dgrad"): "nvidia-h100_2026-12-06_40d7cdc-tune-convnext-dw-dgrad.json",
    ("convnext-dw", "wgrad"): "nvidia-h100_2026-12-07_4997d9a-tune-convnext-dw-wgrad.json",
    ("efficientnet-b0-dw", "fprop"): "nvidia-h100_2026-12-07_360b732-tune-efficientnet-b0-dw-fprop.json",
    ("efficientnet-b0-dw", "dgrad"): "nvidia-h100_2026-12-06_a40b87e-tune-efficientnet-b0-dw-dgrad.json",
    ("efficientnet-b0-dw", "wgrad"): "nvidia-h100_2026-12-07_e89f18f-tune-efficientnet-b0-dw-wgrad.json",
    ("mobilenetv2-pw", "fprop"): "nvidia-h200_2026-12-04_faa56ad-tune-mobilenetv2-pw-fprop.json",
    ("mobilenetv2-pw", "dgrad"): "nvidia-h200_2026-12-04_f26ee2e-tune-mobilenetv2-pw-dgrad.json",
    ("mobilenetv2-pw", "wgrad"): "nvidia-h100_2026-12-05_4608fd8-tune-mobilenetv2-pw-wgrad.json",
    ("efficientnet-b0-pw", "fprop"): "nvidia-h200_2026-12-04_faa56ad-tune-efficientnet-b0-pw-fprop.json",
    ("efficientnet-b0-pw", "dgrad"): "nvidia-h200_2026-12-04_f26ee2e-tune-efficientnet-b0-pw-dgrad.json",
    ("efficientnet-b0-pw", "wgrad"): "nvidia-h100_2026-12-05_4608fd8-tune-efficientnet-b0-pw-wgrad.json",
    ("resnext50-grouped", "fprop"): "nvidia-h100_2026-12-06_dd95543-tune-resnext50-grouped-fprop.json",
    ("resnext50-grouped", "dgrad"): "nvidia-h100_2026-12-06_dc620aa-tune-resnext50-grouped-dgrad.json",
    ("resnext50-grouped", "wgrad"): "nvidia-h100_2026-12-06_dc620aa-tune-resnext50-grouped-wgrad.json",
    ("large", "wgrad"): "nvidia-h100_2026-12-06_9e97264-tune-large-wgrad.json",
    ("darknet53-down", "dgrad"): "nvidia-h200_2026-12-04_1c23207-tune-darknet53-down-dgrad.json",
    ("unet", "fprop"): "nvidia-h200_2026-12-04_1c23207-tune-unet-fprop.json",
}


def _key(p: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in p.items() if k not in ("read_a", "read_b")))


def _ratios(name: str, pass_: str) -> tuple[list[float], int]:
    """Today's default over the best, per layer the log timed it on; and the layers it holds."""
    layers = json.loads((TUNING / name).read_text())["layers"]
    ratios = []
    for layer in layers:
        assert layer.get("pass", pass_) == pass_, (name, layer["layer"])
        rows = [r for r in layer["rows"] if r["ok"] and math.isfinite(r["us"])]
        default = _key(plan(_problem(layer["problem"]), Pass(pass_), H200).as_dict())
        timed = [r["us"] for r in rows if _key(r["plan"]) == default]
        if timed:
            ratios.append(timed[0] / min(r["us"] for r in rows))
    return ratios, len(layers)


@pytest.mark.parametrize("suite, pass_", sorted(LATEST), ids=[f"{s}-{p}" for s, p in sorted(LATEST)])
def test_todays_default_is_within_10_percent_of_the_tuned_best(suite, pass_):
    name = LATEST[suite, pass_]
    assert f"-tune-{suite}-{pass_}.json" in name
    ratios, layers = _ratios(name, pass_)
    assert 2 * len(ratios) >= layers, f"{suite} {pass_}: today's default was timed on {len(ratios)} of {layers} layers"
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
    assert geomean <= 1.10, f"{suite} {pass_}: today's default takes {geomean:.3f}x the tuned best ({name})"


def test_every_listed_log_is_the_latest_of_its_suite_and_pass():
    """No log on disk for a listed suite and pass is from a later day than the one listed (by the
    date in its name; logs of the same day are ordered by hand above)."""
    for (suite, pass_), name in LATEST.items():
        date = name.split("_")[1]
        for other in TUNING.glob(f"nvidia-*-tune-{suite}-{pass_}.json"):
            assert other.name.split("_")[1] <= date, (suite, pass_, other.name, name)
