"""The examples that need no GPU run as their docstrings say (a broken example is a broken README)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_emit_and_inspect_shows_the_launch_and_writes_the_kernel(tmp_path):
    """A C=3 wgrad at batch 256 gets split-K: the example prints both launches, and the
    reduction's grid covers its outputs (16 x 27 = 432, 32 per block when N % 4 != 0)."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "emit_and_inspect.py"), "--batch", "256", "--height", "32",
         "--width", "32", "--in-channels", "3", "--out-channels", "16", "--pass", "wgrad", "-o", str(tmp_path),
         "--lines", "5"],
        capture_output=True, text=True, check=True, cwd=ROOT, timeout=120,
    ).stdout
    assert "split-K reduction" in out
    m = re.search(r"grid \((\d+), 1, 1\) = ceil\((\d+) outputs / (\d+) per block\)", out)
    assert m, out
    blocks, outputs, per_block = map(int, m.groups())
    assert outputs == 16 * 27 and blocks == -(-outputs // per_block)
    written = list(tmp_path.glob("*.cu"))
    assert len(written) == 1 and "extern \"C\" __global__" in written[0].read_text()


@pytest.mark.gpu
def test_cupy_train_learns_and_its_graph_replays_match_eager():
    """examples/cupy_train.py: the loss falls (by 15% in 40 steps at batch 64), and the step replayed as one CUDA graph gives
    bit-identical parameters to the same steps run eagerly (the script exits 1 otherwise)."""
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "cupy_train.py"), "--batch", "64", "--steps", "40"],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    losses = [float(m) for m in re.findall(r"loss (\d+\.\d+)", out.stdout)]
    assert len(losses) >= 3 and losses[-1] < 0.85 * losses[0], out.stdout
    assert re.search(r"eager [\d.]+ ms/step, one CUDA graph [\d.]+ ms/step", out.stdout), out.stdout


@pytest.mark.gpu
def test_train_step_agrees_with_cudnn_and_runs_the_compiled_step():
    """examples/train_step.py on a GPU: its first step agrees with cuDNN's (the script exits 1
    otherwise), and the eager and compiled steps (forward+loss under CUDA graphs, the optimizer
    compiled) run and print their ms/step on both sides.  reduce-overhead on the model alone
    is left out to keep the test short (about 3 inductor compiles a side a mode)."""
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "train_step.py"), "--batch", "64", "--steps", "5",
                          "--warmup", "3", "--modes", "eager", "compiled-step"],
                         capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    for mode in ("eager", "compiled-step"):
        assert re.search(rf"{mode}\s+convgen / cuDNN = [\d.]+x", out.stdout), out.stdout
