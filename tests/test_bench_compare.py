"""scripts/bench_compare.py: the A/B table of two bench results, with cuDNN as the drift control."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_compare", ROOT / "scripts" / "bench_compare.py")
bench_compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_compare)

RESULT = ROOT / "benchmarks" / "results" / "nvidia-h100-80gb-hbm3_2026-12-05_dafd8bb-convnext-dw-launch-bounds-asis.json"


def _row(layer: str, pass_: str, cg: float | None, cudnn: float) -> dict:
    side = (lambda us: {"time_us": {"median": us}, "error": None} if us else {"time_us": None, "error": "failed"})
    return {"suite": "s", "layer": layer, "pass": pass_, "variant": "same", "convgen": side(cg), "cudnn": side(cudnn)}


def _write(path: Path, gpu: str, rows: list[dict]) -> Path:
    path.write_text(json.dumps({"gpu": {"name": gpu}, "suites": [{"name": "s", "rows": rows}]}))
    return path


def test_a_result_against_itself_is_even_on_every_row():
    lines, means = bench_compare.compare(RESULT, RESULT)
    assert means and all(abs(g - 1) < 1e-12 and abs(d - 1) < 1e-12 and n == 4 for g, d, n in means.values())
    assert not any("warning" in ln or "only in" in ln for ln in lines)


def test_speedup_drift_and_unmatched_rows(tmp_path):
    """B runs convgen twice as fast on l1 while cuDNN's own time fell by 10% (drift): A/B is 2,
    adjusted 2 / (1 / 0.9); a row B lacks and a row that failed in B stay out of the means."""
    a = _write(tmp_path / "a.json", "GPU X", [_row("l1", "fprop", 100.0, 50.0), _row("l2", "fprop", 10.0, 10.0),
                                             _row("l3", "fprop", 30.0, 30.0)])
    b = _write(tmp_path / "b.json", "GPU Y", [_row("l1", "fprop", 50.0, 45.0), _row("l2", "fprop", None, 10.0)])
    lines, means = bench_compare.compare(a, b)
    g, d, n = means[("s", "fprop")]
    assert n == 1 and g == pytest.approx(2.0) and d == pytest.approx(2.0 * 45.0 / 50.0)
    assert any("l2" in ln and "skipped" in ln for ln in lines)
    assert any("l3" in ln and "only in A" in ln for ln in lines)
    assert any(ln.startswith("warning: the runs name different GPUs") for ln in lines)
    _, swapped = bench_compare.compare(b, a)
    assert swapped[("s", "fprop")][0] == pytest.approx(1 / g)


def test_cli_exits_1_when_no_row_matches(tmp_path, capsys):
    a = _write(tmp_path / "a.json", "G", [_row("l1", "fprop", 1.0, 1.0)])
    b = _write(tmp_path / "b.json", "G", [_row("l2", "fprop", 1.0, 1.0)])
    assert bench_compare.main([str(a), str(b)]) == 1
    assert bench_compare.main([str(RESULT), str(RESULT)]) == 0
    assert "geomean convnext-dw fprop" in capsys.readouterr().out
