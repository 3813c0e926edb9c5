"""convgen.compile's disk cache (convgen/kernel_store.py), on a machine with no GPU: a second
call is read from disk, the key changes with every input that changes the binary, and an entry
that is damaged, of another arch or kernel, or of an older format is discarded and rebuilt,
never loaded; an unwritable folder falls back to memory with one warning, and writers racing
on one cache leave one whole entry and no temp file.  Each test has its own cache folder
(tests/test_compile.py's fixtures), so the user's cache is never read or written."""

from __future__ import annotations

import multiprocessing
import os
import time
import warnings
from pathlib import Path

import pytest

import convgen
import convgen.compile as cc
import convgen.kernel_store as ks
from convgen import resources

from test_compile import ELF, SMEM_SRC, WMMA_SRC, _isolated, count_compiles  # noqa: F401  (two fixtures)


_REAL_COMPILE = cc.compile_binary  # unpatched by count_compiles


def entries(root: Path) -> list[Path]:
    return sorted((root / "kernels").glob("*.bin"))


def test_cache_dir_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("CONVGEN_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cc.cache_dir() == tmp_path / "xdg" / "convgen"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cc.cache_dir() == tmp_path / "home" / ".cache" / "convgen"


def test_second_call_hits_disk(count_compiles, tmp_path):
    first = cc.cached_binary(WMMA_SRC, arch="sm_90")
    assert count_compiles == ["sm_90"]
    assert cc.cached_binary(WMMA_SRC, arch="sm_90") == first  # memory
    cc.clear_memory_cache()
    assert cc.cached_binary(WMMA_SRC, arch="sm_90") == first  # disk
    assert count_compiles == ["sm_90"]
    [entry] = entries(tmp_path / "cache")
    assert entry.stem == cc.cache_key(WMMA_SRC, arch="sm_90")
    cc.cached_binary(WMMA_SRC, arch="sm_80")
    assert count_compiles == ["sm_90", "sm_80"]
    assert len(entries(tmp_path / "cache")) == 2


def test_key_changes_with_every_input(monkeypatch):
    base = cc.cache_key(WMMA_SRC, arch="sm_90", options=["-DX=1"])
    assert base == cc.cache_key(WMMA_SRC, arch="sm_90", options=["-DX=1"])
    assert len(base) == 64
    variants = {
        "source": cc.cache_key(WMMA_SRC + "\n", arch="sm_90", options=["-DX=1"]),
        "options": cc.cache_key(WMMA_SRC, arch="sm_90", options=["-DX=2"]),
        "no options": cc.cache_key(WMMA_SRC, arch="sm_90"),
        "option order": cc.cache_key(WMMA_SRC, arch="sm_90", options=["-DX=1", "-lineinfo"]),
        "arch": cc.cache_key(WMMA_SRC, arch="sm_80", options=["-DX=1"]),
    }
    with monkeypatch.context() as m:
        m.setattr(convgen, "__version__", "999.0")
        variants["version"] = cc.cache_key(WMMA_SRC, arch="sm_90", options=["-DX=1"])
    with monkeypatch.context() as m:
        m.setattr(resources, "templates_hash", lambda: "0" * 64)
        variants["templates"] = cc.cache_key(WMMA_SRC, arch="sm_90", options=["-DX=1"])
    with monkeypatch.context() as m:
        m.setattr(cc, "nvrtc_version", lambda: (99, 9))
        variants["nvrtc"] = cc.cache_key(WMMA_SRC, arch="sm_90", options=["-DX=1"])
    with monkeypatch.context() as m:
        m.setattr(ks, "FORMAT_TAG", ks.FORMAT_TAG + 1)
        variants["format"] = cc.cache_key(WMMA_SRC, arch="sm_90", options=["-DX=1"])
    assert all(v != base for v in variants.values()), variants
    assert len(set(variants.values())) == len(variants)


def test_key_ignores_include_dirs(monkeypatch, tmp_path):
    base = cc.cache_key(WMMA_SRC, arch="sm_90")
    monkeypatch.setattr(cc, "cuda_include_dirs", lambda: [str(tmp_path)])
    assert cc.cache_key(WMMA_SRC, arch="sm_90") == base


def _corrupt_flip(data: bytes) -> bytes:
    mid = len(data) - 100  # inside the payload
    return data[:mid] + bytes([data[mid] ^ 0xFF]) + data[mid + 1:]


def _corrupt_truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _corrupt_header_only(data: bytes) -> bytes:
    return data[:10]


def _other_arch(data: bytes) -> bytes:
    key = cc.cache_key(WMMA_SRC, arch="sm_90")
    return ks._pack("sm_80", ks._unpack(data, "sm_90", key), key)


def _other_kernel(data: bytes) -> bytes:
    """A valid entry of another kernel (same arch), as if copied over this key's file."""
    other = cc.cache_key(SMEM_SRC, arch="sm_90")
    return ks._pack("sm_90", _REAL_COMPILE(SMEM_SRC, arch="sm_90"), other)


def _old_format(data: bytes) -> bytes:
    """A format-2 entry (no key in the header) of this very binary."""
    payload = ks._unpack(data, "sm_90", cc.cache_key(WMMA_SRC, arch="sm_90"))
    a = b"sm_90"
    import hashlib
    import struct

    return struct.pack("<8sIH32sQ", b"CVGNBIN\0", 2, len(a), hashlib.sha256(payload).digest(), len(payload)) + a + payload


def _bad_magic(data: bytes) -> bytes:
    return b"X" + data[1:]


@pytest.mark.parametrize(
    "damage", [_corrupt_flip, _corrupt_truncate, _corrupt_header_only, _other_arch, _bad_magic, _other_kernel,
               _old_format]
)
def test_bad_entry_is_discarded_and_rebuilt(damage, count_compiles, tmp_path):
    good = cc.cached_binary(WMMA_SRC, arch="sm_90")
    [entry] = entries(tmp_path / "cache")
    original = entry.read_bytes()
    entry.write_bytes(damage(original))
    cc.clear_memory_cache()
    assert ks._read_entry(entry, "sm_90") is None
    assert not entry.exists()  # deleted, not left to be misread again
    entry.write_bytes(damage(original))
    assert cc.cached_binary(WMMA_SRC, arch="sm_90") == good
    assert count_compiles == ["sm_90", "sm_90"]  # rebuilt
    assert entry.read_bytes() == original  # and rewritten whole


def test_entry_checks_arch_and_key():
    packed = ks._pack("sm_90", b"payload", "k1")
    assert ks._unpack(packed, "sm_90", "k1") == b"payload"
    assert ks._unpack(packed, "sm_9", "k1") is None
    assert ks._unpack(packed, "sm_80", "k1") is None
    assert ks._unpack(packed + b"x", "sm_90", "k1") is None
    assert ks._unpack(packed, "sm_90", "k2") is None


def test_entry_renamed_to_another_key_is_refused(tmp_path):
    """The header binds an entry to the key its file is named after."""
    folder = tmp_path / "cache" / "kernels"
    ks._write_entry(folder / "aaaa.bin", "sm_90", b"payload of aaaa")
    (folder / "aaaa.bin").rename(folder / "bbbb.bin")
    assert ks._read_entry(folder / "bbbb.bin", "sm_90") is None
    assert not (folder / "bbbb.bin").exists()


def test_unwritable_cache_dir_works_in_memory_with_one_warning(monkeypatch, tmp_path, count_compiles):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(blocker / "cache"))  # parent is a file: even root can't
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = cc.cached_binary(WMMA_SRC, arch="sm_90")
        b = cc.cached_binary(WMMA_SRC, arch="sm_80")
        cc.clear_memory_cache()
        c = cc.cached_binary(WMMA_SRC, arch="sm_90")
    assert a[:4] == b[:4] == c[:4] == ELF and a == c
    mine = [w for w in caught if "kernel cache folder" in str(w.message)]
    assert len(mine) == 1, [str(w.message) for w in caught]
    assert "CONVGEN_CACHE_DIR" in str(mine[0].message)
    assert count_compiles == ["sm_90", "sm_80", "sm_90"]
    assert blocker.read_text() == "not a folder"


def test_failed_source_dump_falls_back_to_temp(monkeypatch, tmp_path):
    import tempfile

    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # the fallback: not the real /tmp
    (tmp_path / "tmp").mkdir()
    with pytest.raises(cc.CompileError) as info:
        cc.compile_binary("this is not cuda", arch="sm_90")
    assert info.value.source_path.exists()
    assert info.value.source_path.read_text() == "this is not cuda"
    assert info.value.source_path.parent.parent == tmp_path / "tmp"
    assert info.value.source_path.parent.name.startswith("convgen-failed-")


def _worker(cache: str, barrier, queue) -> None:
    os.environ["CONVGEN_CACHE_DIR"] = cache
    import convgen.compile as c

    c.nvrtc_version()  # warm up NVRTC so the workers reach the cache together
    barrier.wait()
    queue.put(c.cached_binary(WMMA_SRC, arch="sm_90"))


def test_concurrent_writers(tmp_path):
    """A dozen processes compile one kernel into one empty cache at once: one entry, the same
    binary everywhere, and no temp file left."""
    cache = tmp_path / "shared"
    ctx = multiprocessing.get_context("spawn")
    n = 12
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(str(cache), barrier, queue)) for _ in range(n)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in range(n)]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len(set(results)) == 1 and results[0][:4] == ELF
    [entry] = entries(cache)
    assert ks._read_entry(entry, "sm_90") == results[0]
    leftovers = [p for p in cache.rglob("*") if p.is_file() and p.suffix != ".bin"]
    assert leftovers == []
    assert [p.name for p in (cache / "kernels").iterdir()] == [entry.name]


def test_stale_temp_files_are_removed_on_the_next_write(tmp_path):
    """A writer killed mid-write leaves its temp file; the next write removes it once it is old,
    and leaves a live writer's (young) one alone."""
    folder = tmp_path / "cache" / "kernels"
    folder.mkdir(parents=True)
    stale, live = folder / ".dead.bin.123.abcd.tmp", folder / ".busy.bin.456.efgh.tmp"
    stale.write_bytes(b"half an entry")
    live.write_bytes(b"being written")
    old = time.time() - ks._STALE_TEMP_SECONDS - 60
    os.utime(stale, (old, old))
    ks._write_entry(folder / "k.bin", "sm_90", b"payload")
    assert sorted(p.name for p in folder.iterdir()) == sorted([live.name, "k.bin"])


def test_write_is_atomic_and_leaves_no_temp(tmp_path):
    from convgen.fsio import atomic_write

    path = tmp_path / "cache" / "kernels" / "k.bin"
    for i in range(20):
        atomic_write(path, ks._pack("sm_90", bytes([i]) * 1000, path.stem))
        assert ks._read_entry(path, "sm_90") == bytes([i]) * 1000
    assert [p.name for p in path.parent.iterdir()] == ["k.bin"]
