"""`convgen cache info` / `convgen cache clear` on a cache folder of known content (no NVRTC)."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

import convgen.kernel_store as ks
from convgen import cli


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(list(argv))
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(root))
    kernels = root / "kernels"
    ks._write_entry(kernels / ("a" * 64 + ".bin"), "sm_90", b"x" * 1000)
    ks._write_entry(kernels / ("b" * 64 + ".bin"), "sm_80", b"y" * 500)
    (kernels / ("c" * 64 + ".bin")).write_bytes(b"CVGNBIN\0" + (2).to_bytes(4, "little") + b"old entry")
    (kernels / ".dead.bin.1.x.tmp").write_bytes(b"half")
    (root / "failed").mkdir()
    (root / "failed" / "0123-k.cu").write_text("bad source")
    (root / "failed" / "0123-k.cu.log").write_text("error")
    (root / "tuning.json").write_text(json.dumps({"format": 1, "gpus": {"nvidia-h200": {"k1": {}, "k2": {}}}}))
    (root / "notes.txt").write_text("the user's own file")
    return root


def test_info_reports_location_entries_and_tuning(cache):
    rc, out, err = run("cache", "info")
    assert rc == 0 and not err
    assert f"location:  {cache} (set by CONVGEN_CACHE_DIR)" in out
    assert "3 compiled entries" in out and "(1 of an older format" in out
    assert "1 temporary files" in out and "1 sources of failed compiles" in out
    assert f"{cache / 'tuning.json'}: nvidia-h200 (2 entries)" in out
    assert "shipped:" in out and "nvidia-h200.json" in out
    rc, out, _ = run("cache", "info", "--json")
    info = json.loads(out)
    assert info["kernels"]["entries"] == 3 and info["kernels"]["older_format"] == 1
    assert info["kernels"]["bytes"] == sum(p.stat().st_size for p in (cache / "kernels").glob("*.bin"))


def test_clear_removes_kernels_and_keeps_tuning_and_other_files(cache):
    rc, out, _ = run("cache", "clear")
    assert rc == 0 and out.startswith("removed 3 compiled kernels") and "tuning databases kept" in out
    assert not (cache / "kernels").exists() and not (cache / "failed").exists()
    assert sorted(p.name for p in cache.iterdir()) == ["notes.txt", "tuning.json"]
    rc, out, _ = run("cache", "info")
    assert "0 compiled entries" in out
    rc, out, _ = run("cache", "clear", "--all")
    assert rc == 0 and "1 tuning database(s)" in out
    assert [p.name for p in cache.iterdir()] == ["notes.txt"]


def test_info_and_clear_of_a_cache_not_yet_created(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(tmp_path / "none"))
    rc, out, _ = run("cache", "info")
    assert rc == 0 and "not created yet" in out and "0 compiled entries" in out
    rc, out, _ = run("cache", "clear")
    assert rc == 0 and "removed 0 compiled kernels" in out
    assert not (tmp_path / "none").exists()


def test_cache_needs_an_action():
    rc, _, err = run("cache")
    assert rc == 2 and err.startswith("convgen: error: cache: ") and err.count("\n") == 1
