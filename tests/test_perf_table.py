"""scripts/perf_table.py: README's table from bench results, the newest run of each suite that
ran the plans asked for, and a suite with no latency-bound rows said as such."""

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


def _suite(name, source, gpu, eager, bound, bound_rows, rows=3):
    summary = {"speedup": _three(*gpu), "eager_speedup": _three(*eager),
               "count": {"fprop": rows // 3, "dgrad": rows // 3, "wgrad": rows // 3, "all": rows},
               "by_regime": {"latency/memory": {"speedup": _three(*bound) if bound else {},
                                                "count": {"all": bound_rows}}}}
    return {"name": name, "summary": summary, "rows": [{"convgen": {"plan_source": source}}] * rows}


def _write(tmp_path, name, commit, stamp, *suites):
    path = tmp_path / name
    path.write_text(json.dumps({"git": {"commit": commit}, "timestamp": stamp, "suites": list(suites)}))
    return path


def test_the_newest_planner_run_of_each_suite_gives_its_row(tmp_path):
    old = _write(tmp_path, "z-old.json", "aaaaaaa", "2026-12-07T08:00:00+00:00",
                 _suite("resnet50", "planner", (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), None, 3))
    new = _write(tmp_path, "a-new.json", "bbbbbbb", "2026-12-07T09:00:00+00:00",
                 _suite("resnet50", "planner", (1.02, 1.051, 0.949), (1.1, 1.2, 1.3), (0.98, 1.0, 1.06), 2),
                 _suite("large", "planner", (0.96, 0.97, 0.95), (1, 1, 1), None, 0))
    tuned = _write(tmp_path, "m-tuned.json", "ccccccc", "2026-12-07T10:00:00+00:00",
                   _suite("resnet50", "first use", (2.0, 2.0, 2.0), (2, 2, 2), None, 3))
    table = perf_table.rows([new, tuned, old])  # not in time order: the timestamps decide
    assert table == ["| large, bbbbbbb | 0.96 / 0.97 / 0.95 | 1.00 / 1.00 / 1.00 | none |",
                     "| resnet50, bbbbbbb | 1.02 / 1.05 / 0.95 | 1.10 / 1.20 / 1.30 | 0.98 / 1.00 / 1.06 (2 rows) |"]
    assert perf_table.rows([new, tuned, old], "first use") == [
        "| resnet50, ccccccc | 2.00 / 2.00 / 2.00 | 2.00 / 2.00 / 2.00 | all rows (3) |"]
