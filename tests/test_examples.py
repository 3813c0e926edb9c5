"""The examples that need no GPU run as their docstrings say (a broken example is a broken README)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

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
