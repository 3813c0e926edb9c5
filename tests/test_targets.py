"""scripts/targets.py: the issues' speed targets judged on bench results, with the verdict
depending on the run's plan source, and failed rows left out by name."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("targets", ROOT / "scripts" / "targets.py")
targets = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(targets)

DEFAULTS = "the planner's defaults (CONVGEN_TUNED=0: no tuning database)"
FIRST_USE = "this GPU's tuning databases, else the planner; a shape neither covers is tuned on its first call (autotune)"


def _row(layer, pass_, speedup, cudnn_tf, *, c=64, r=1, gflop=1.0, cg_tf=None, ok=True, over_floor=3.0):
    return {"layer": layer, "pass": pass_, "variant": "same", "speedup": speedup, "flops": gflop * 1e9,
            "problem": {"c": c, "k": c, "r": r, "s": r}, "over_floor": over_floor, "check": {"ok": ok},
            "convgen": {"tflops": cg_tf if cg_tf is not None else cudnn_tf * speedup, "error": None},
            "cudnn": {"tflops": cudnn_tf, "error": None}}


def _result(plans, suites):
    return {"gpu": {"name": "NVIDIA H200"}, "git": {"commit": "abc1234"}, "date": "2026-12-07",
            "settings": {"plans": plans} if plans else {}, "suites": [{"name": n, "rows": r} for n, r in suites]}


def test_issue_16_bound_depends_on_the_plan_source_and_skips_bad_rows():
    rows = [_row("a", "fprop", 0.8, 50.0), _row("b", "fprop", 1.0, 80.0),  # geomean 0.894
            _row("c", "fprop", 3.0, 90.0, ok=False),                       # mismatched: would lift it to 1.29
            _row("d", "fprop", 0.5, 400.0)]                                 # compute-bound: listed, not counted
    text = "\n".join(targets.judge(_result(DEFAULTS, [("resnet18", rows)]), "r.json"))
    assert "plans: defaults" in text and "left out (failed or mismatched): c fprop" in text
    assert "resnet18 fprop: issue 16, 2 of 3 rows under 300 TFLOP/s: 0.89x (target 0.9x): MISSED" in text
    assert "compute-bound d: convgen 200, cuDNN 400 TFLOP/s (0.50x)" in text
    first = "\n".join(targets.judge(_result(FIRST_USE, [("resnet18", rows[:2] + [_row("e", "fprop", 1.4, 9.0)])]),
                                    "r.json"))
    assert "plans: first use" in first and "3 of 3 rows under 300 TFLOP/s: 1.04x (target 1.0x): met" in first
    unknown = "\n".join(targets.judge(_result(None, [("resnet18", rows)]), "r.json"))
    assert "plans: not recorded" in unknown and "0.89x (target -): -" in unknown  # no verdict without a source
    assumed = "\n".join(targets.judge(_result(None, [("resnet18", rows)]), "r.json", "defaults"))
    assert "plans: defaults (assumed: not recorded)" in assumed and "0.89x (target 0.9x): MISSED" in assumed
    recorded = "\n".join(targets.judge(_result(FIRST_USE, [("resnet18", rows)]), "r.json", "defaults"))
    assert "plans: first use ==" in recorded  # a run's own record wins over the assumption


def test_issue_17_and_21_targets():
    r50 = [_row("l2-3x3", "wgrad", 0.9, 350.0, c=128, r=3, gflop=30.0, cg_tf=499.0),
           _row("l4-1x1", "wgrad", 1.05, 200.0)]
    dw = [_row("dw1", "dgrad", 2.0, 5.0, over_floor=1.9), _row("dw2", "dgrad", 1.2, 5.0, over_floor=2.2)]
    text = "\n".join(targets.judge(_result(DEFAULTS, [("resnet50", r50), ("convnext-dw", dw)]), "r.json"))
    assert "resnet50 wgrad: issue 17, all 2 rows: 0.97x (target 1.0x): MISSED" in text
    assert "resnet50 wgrad: issue 17, l2-3x3 (30 GFLOP): 499 TFLOP/s (target 500): MISSED" in text
    assert "l4-1x1 (" not in text  # 1x1 and small: not one of the 3x3 rows issue 17 counts
    assert "convnext-dw dgrad: issue 21, 1.55x cuDNN (target 1.5x): met; 2.04x the floor (target 2x): MISSED" in text


def test_the_command_reads_a_committed_run(capsys):
    path = ROOT / "benchmarks" / "results" / "nvidia-h200_2026-12-05_a964533-resnet50-gpu-only-planner.json"
    assert targets.main([str(path)]) == 0
    out = capsys.readouterr().out
    n = len([r for r in json.loads(path.read_text())["suites"][0]["rows"] if r["pass"] == "fprop"])
    assert f"resnet50 fprop: issue 17, all {n} rows:" in out and "plans: not recorded" in out


def test_pool_judges_held_out_runs_as_one_suite(tmp_path, capsys):
    """Each held-out layer comes back as a one-shape run in a folder of its name: pooled, the
    rows take those names, issue 16's bound and issue 17's rates apply to them, and each pass
    gets its mean over all rows."""
    runs = {"dn121-1x1": [_row("shape", "fprop", 0.8, 100), _row("shape", "wgrad", 1.25, 100)],
            "sd-unet-640": [_row("shape", "fprop", 1.0, 500, c=640, r=3, gflop=60, cg_tf=610)]}
    paths = []
    for name, rows in runs.items():
        (tmp_path / name).mkdir()
        path = tmp_path / name / "nvidia-h200_2026-12-07_abc1234-shape.json"
        path.write_text(json.dumps(_result(DEFAULTS, [("shape", rows)])))
        paths.append(str(path))
    assert targets.main(["--pool", "holdout", *paths]) == 0
    text = capsys.readouterr().out
    assert "holdout fprop: issue 16, 1 of 2 rows under 300 TFLOP/s: 0.80x (target 0.9x): MISSED" in text
    assert "compute-bound sd-unet-640: convgen 610, cuDNN 500 TFLOP/s (1.00x)" in text
    assert "holdout fprop: issue 17, sd-unet-640 (60 GFLOP): 610 TFLOP/s (target 600): met" in text
    assert "holdout fprop: all 2 rows: 0.89x cuDNN's GPU time" in text
    assert "holdout wgrad: all 1 rows: 1.25x cuDNN's GPU time" in text


def test_pool_refuses_runs_of_different_commits(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_result(DEFAULTS, [("shape", [_row("shape", "fprop", 1.0, 100)])])))
    other = _result(DEFAULTS, [("shape", [_row("shape", "fprop", 1.0, 100)])])
    other["git"]["commit"] = "def5678"
    b.write_text(json.dumps(other))
    try:
        targets.main(["--pool", "holdout", str(a), str(b)])
    except SystemExit as e:
        assert e.code == 2
    else:
        raise AssertionError("mixed commits were pooled")
    assert "one GPU, commit and plan source" in capsys.readouterr().err
