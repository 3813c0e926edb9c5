"""generated/ is a committed snapshot of `convgen emit`, so a change to the templates,
the planner or the emitter shows up in review as a diff of real kernels.  These tests
re-emit each snapshot into a temporary folder and require it to be byte-identical to
the committed one, with no file missing or extra; the failure says how to regenerate."""

from __future__ import annotations

from pathlib import Path

import pytest

from convgen.cli import main

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "generated"

# folder under generated/ -> the `convgen emit` arguments that produce it
SNAPSHOTS: dict[str, list[str]] = {
    "cuda/cifar-resnet": ["--suite", "cifar-resnet"],
    "hip/cifar-resnet": ["--suite", "cifar-resnet", "--backend", "hip", "--arch", "gfx1201"],
    # the kernels the shipped tuning database (convgen/tuning/nvidia-h200.json) runs
    **{f"cuda/tuned-h200/{suite}": ["--suite", suite, "--tuned", "nvidia-h200"]
       for suite in ("resnet50",)},  # the only suite it holds entries for
}


def regenerate_command(folder: str) -> str:
    args = " ".join(SNAPSHOTS[folder])
    return f"rm -rf generated/{folder} && python3 -m convgen.cli emit {args} -o generated/{folder}"


def _first_difference(a: bytes, b: bytes) -> str:
    la, lb = a.decode(errors="replace").splitlines(), b.decode(errors="replace").splitlines()
    for i, (x, y) in enumerate(zip(la, lb), 1):
        if x != y:
            col = next((c for c, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
            lo = max(0, col - 30)
            return f"line {i} col {col + 1}: committed {x[lo:col + 40]!r}, now {y[lo:col + 40]!r}"
    return f"length: committed {len(la)} lines, now {len(lb)} lines"


@pytest.mark.parametrize("folder", sorted(SNAPSHOTS))
def test_snapshot_is_up_to_date(folder, tmp_path, capsys):
    committed = GENERATED / folder
    fix = f"Regenerate with (from the repository root):\n    {regenerate_command(folder)}\nand commit the result."
    assert committed.is_dir(), f"generated/{folder} is missing.\n{fix}"

    fresh = tmp_path / "fresh"
    status = main(["emit", *SNAPSHOTS[folder], "-q", "-o", str(fresh)])
    assert status == 0, capsys.readouterr().err

    def files(root: Path) -> set[str]:
        return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}

    old, new = files(committed), files(fresh)
    problems = []
    if new - old:
        problems.append("missing from the snapshot: " + ", ".join(sorted(new - old)))
    if old - new:
        problems.append("no longer emitted (stale): " + ", ".join(sorted(old - new)))
    for name in sorted(old & new):
        a, b = (committed / name).read_bytes(), (fresh / name).read_bytes()
        if a != b:
            problems.append(f"{name} differs at {_first_difference(a, b)}")
    assert not problems, (
        f"generated/{folder} does not match what `convgen emit` produces now "
        f"({len(problems)} problem(s)):\n  " + "\n  ".join(problems[:12])
        + ("\n  ..." if len(problems) > 12 else "") + f"\n{fix}"
    )


def test_every_generated_folder_has_a_recipe():
    """A folder under generated/ that no test regenerates would silently rot."""
    manifests = sorted(p.parent.relative_to(GENERATED).as_posix() for p in GENERATED.rglob("manifest.json"))
    assert manifests == sorted(SNAPSHOTS)
    stray = [p.relative_to(GENERATED).as_posix() for p in GENERATED.rglob("*")
             if p.is_file() and not any(p.relative_to(GENERATED).as_posix().startswith(f + "/") for f in SNAPSHOTS)]
    assert not stray, f"files under generated/ outside any snapshot: {stray}"


def test_the_failure_message_names_the_command():
    assert regenerate_command("cuda/cifar-resnet") == (
        "rm -rf generated/cuda/cifar-resnet && "
        "python3 -m convgen.cli emit --suite cifar-resnet -o generated/cuda/cifar-resnet"
    )


def test_the_tuned_snapshot_is_what_the_runtime_runs_on_an_h200(tmp_path, monkeypatch):
    """generated/cuda/tuned-h200 holds, for every entry of the shipped database, the plan the
    run-time lookup (convgen.tuning_db.tuned_plan, with no user database) picks on an H200: no entry
    is missing, none is extra."""
    import json

    from convgen import tuning_db as tune
    from convgen.ir import Pass, Target
    from convgen.suites import SUITES

    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(tmp_path))  # no user tuning database
    monkeypatch.delenv("CONVGEN_TUNED", raising=False)
    monkeypatch.setattr(tune, "_loaded", {})
    shipped = json.loads((tune.SHIPPED_DIR / "nvidia-h200.json").read_text())["gpus"]["nvidia-h200"]
    seen = set()
    for folder in sorted(f for f in SNAPSHOTS if f.startswith("cuda/tuned-h200/")):
        layers = {l.name: l for l in SUITES[folder.rsplit("/", 1)[1]]}
        for e in json.loads((GENERATED / folder / "manifest.json").read_text())["kernels"]:
            layer, pass_ = layers[e["layer"]], Pass(e["spec"]["pass"])
            plan = tune.tuned_plan("NVIDIA H200", layer.problem, pass_, "float16", Target("sm_90", 132))
            assert plan is not None and e["spec"]["plan"] == plan.as_dict(), (folder, e["file"])
            seen.add(tune.tune_key(layer.problem.geometry, pass_, "float16", "sm_90"))
    assert seen == set(shipped)
