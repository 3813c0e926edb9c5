"""scripts/perf_table.py: README's table from bench results, each pass of each suite from the
newest run that measured it with the plans asked for, and a suite with no latency-bound rows
said as such."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("perf_table", ROOT / "scripts" / "perf_table.py")
perf_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(perf_table)


def _three(f, d, w):
    return {"fprop": f, "dgrad": d, "wgrad": w, "all": (f * d * w) ** (1 / 3)}


def _suite(name, source, gpu, eager, bound, bound_rows, rows=3, passes=("fprop", "dgrad", "wgrad")):
    """A suite's summary as `convgen bench` writes it: `rows` rows a pass of `passes`, of which
    bound_rows (a count a pass, or one count for all) are latency-bound."""
    per = bound_rows if isinstance(bound_rows, tuple) else (bound_rows,) * 3
    count = {p: rows if p in passes else 0 for p in ("fprop", "dgrad", "wgrad")}
    summary = {"speedup": _three(*gpu), "eager_speedup": _three(*eager),
               "count": {**count, "all": sum(count.values())},
               "by_regime": {"latency/memory": {"speedup": _three(*bound) if bound else {},
                                                "count": {**dict(zip(("fprop", "dgrad", "wgrad"), per)),
                                                          "all": sum(per)}}}}
    return {"name": name, "summary": summary, "rows": [{"convgen": {"plan_source": source}}] * (rows * len(passes))}


def _write(tmp_path, name, commit, stamp, *suites):
    path = tmp_path / name
    path.write_text(json.dumps({"git": {"commit": commit}, "timestamp": stamp, "suites": list(suites)}))
    return path


def test_the_newest_planner_run_of_each_suite_gives_its_row(tmp_path):
    old = _write(tmp_path, "z-old.json", "aaaaaaa", "2026-12-07T08:00:00+00:00",
                 _suite("resnet50", "planner", (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), None, 3))
    new = _write(tmp_path, "a-new.json", "bbbbbbb", "2026-12-07T09:00:00+00:00",
                 _suite("resnet50", "planner", (1.02, 1.051, 0.949), (1.1, 1.2, 1.3), (0.98, 1.0, 1.06), (1, 0, 1), 1),
                 _suite("large", "planner", (0.96, 0.97, 0.95), (1, 1, 1), None, 0, 1))
    tuned = _write(tmp_path, "m-tuned.json", "ccccccc", "2026-12-07T10:00:00+00:00",
                   _suite("resnet50", "first use", (2.0, 2.0, 2.0), (2, 2, 2), None, 1, 1))
    table = perf_table.rows([new, tuned, old])  # not in time order: the timestamps decide
    assert table == ["| large, bbbbbbb | 0.96 / 0.97 / 0.95 | 1.00 / 1.00 / 1.00 | none |",
                     "| resnet50, bbbbbbb | 1.02 / 1.05 / 0.95 | 1.10 / 1.20 / 1.30 | 0.98 / - / 1.06 (2 rows) |"]
    assert perf_table.rows([new, tuned, old], "first use") == [
        "| resnet50, ccccccc | 2.00 / 2.00 / 2.00 | 2.00 / 2.00 / 2.00 | all rows (3) |"]


def test_a_run_of_one_pass_updates_that_pass_only(tmp_path):
    """A newer run of wgrad alone (a wgrad change benched by itself) gives the row its wgrad
    figures and its commit beside the older run's; fprop and dgrad stay the older run's."""
    whole = _write(tmp_path, "whole.json", "aaaaaaa", "2026-12-07T08:00:00+00:00",
                   _suite("vgg16", "planner", (1.07, 1.06, 1.00), (1.08, 1.08, 0.99), (1.5, 2.0, 1.4), (1, 1, 1), 2))
    wgrad = _write(tmp_path, "wgrad.json", "bbbbbbb", "2026-12-07T09:00:00+00:00",
                   _suite("vgg16", "planner", (0.0, 0.0, 1.10), (0.0, 0.0, 1.2), (0.0, 0.0, 1.6), (0, 0, 2), 2,
                          passes=("wgrad",)))
    assert perf_table.rows([wgrad, whole]) == [
        "| vgg16, aaaaaaa (wgrad bbbbbbb) | 1.07 / 1.06 / 1.10 | 1.08 / 1.08 / 1.20 | 1.50 / 2.00 / 1.60 (4 rows) |"]


def test_a_run_of_some_layers_is_left_out(tmp_path):
    """`convgen bench --layers` (a rule's rows benched alone) measures part of a suite: a newer
    such run leaves the suite's row as its last whole run gave it."""
    whole = _write(tmp_path, "whole.json", "aaaaaaa", "2026-12-07T08:00:00+00:00",
                   _suite("unet", "planner", (1.11, 1.20, 1.18), (1.14, 1.23, 1.15), None, 0, 2))
    some = tmp_path / "some.json"
    some.write_text(json.dumps({"git": {"commit": "bbbbbbb"}, "timestamp": "2026-12-07T09:00:00+00:00",
                                "settings": {"layers_filter": "dec1-cat96,dec2-cat192"},
                                "suites": [_suite("unet", "planner", (0.5, 0.93, 0.5), (1, 1, 1), None, 0, 1,
                                                  passes=("dgrad",))]}))
    assert perf_table.rows([whole, some]) == [
        "| unet, aaaaaaa | 1.11 / 1.20 / 1.18 | 1.14 / 1.23 / 1.15 | none |"]
