"""scripts/planner_regret.py: today's default found among a log's timed candidates and ranked by
its time over the best, worst first; a default no row timed is counted apart, not guessed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from convgen.ir import ConvProblem, Pass, Target
from convgen.planner import plan

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("planner_regret", ROOT / "scripts" / "planner_regret.py")
regret = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(regret)

SHAPE = {"n": 8, "h": 14, "w": 14, "c": 64, "k": 64, "r": 3, "s": 3, "stride": [1, 1], "padding": [1, 1],
         "dilation": [1, 1]}


def _log(tmp_path: Path, name: str, layers: list[dict]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"gpu": "test", "layers": layers}))
    return path


def test_ranks_todays_default_against_the_best_and_counts_the_untimed(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVGEN_TUNED", "0")
    problem = ConvProblem(14, 14, 64, 64, 3, 3, 1, 1, 1, n=8)
    today = {p: plan(problem, p, Target("sm_90", 132)).as_dict() for p in (Pass.FPROP, Pass.DGRAD)}
    other = {**today[Pass.FPROP], "stages": today[Pass.FPROP]["stages"] + 7}  # a plan today's is not
    layers = [
        {"layer": "a", "pass": "fprop", "problem": SHAPE,
         "rows": [{"plan": today[Pass.FPROP], "us": 30.0, "ok": True}, {"plan": other, "us": 20.0, "ok": True}]},
        {"layer": "b", "pass": "dgrad", "problem": SHAPE,
         "rows": [{"plan": today[Pass.DGRAD], "us": 11.0, "ok": True}, {"plan": other, "us": 10.0, "ok": True},
                  {"plan": other, "us": 1.0, "ok": False}]},  # a failed row is never the best
        {"layer": "c", "pass": "wgrad", "problem": SHAPE,
         "rows": [{"plan": other, "us": 5.0, "ok": True}, {"plan": {**other, "split_k": 2}, "us": 6.0, "ok": True}]},
    ]
    timed, untimed = regret.regrets([_log(tmp_path, "log.json", layers)])
    assert [(t[2], round(t[0], 3)) for t in timed] == [("a", 1.5), ("b", 1.1)]
    assert untimed == [("log.json", "c", "wgrad")]
    only, _ = regret.regrets([tmp_path / "log.json"], "dgrad")
    assert [t[2] for t in only] == ["b"]
