"""The on-disk kernel store: compiled binaries under ``<cache dir>/kernels/<key>.bin``.

Modelled on Triton's cache.  An entry is named by its key (:func:`convgen.compile.cache_key`,
a sha256 over everything that can change the binary) and carries a header -- the key's hash,
the arch, the payload's length and sha256 -- that is checked on every read, so a torn,
corrupt, wrong-arch or renamed file is deleted and rebuilt, never loaded.  Writes are atomic
and take no locks (see convgen/compile.py's docstring); a folder that cannot be written is
remembered and skipped, with one warning per process, so compiling still works from memory.
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
import warnings
from pathlib import Path

from . import config
from .fsio import atomic_write

#: Bumped whenever the entry layout or the key recipe changes: old entries then
#: simply miss (their key differs) and are never misread.
FORMAT_TAG = 3  # 3: the header holds the key's hash; 2: binaries are whole ELF files (see compile._whole_elf)
_MAGIC = b"CVGNBIN\0"
# magic, format tag, arch length, sha256 of the entry's key, payload sha256, payload length;
# then arch bytes, payload.
_HEADER = struct.Struct("<8sIH32s32sQ")
# A writer's temp file older than this is from a process that died mid-write: removed on the
# next write into the folder.  (A live write takes milliseconds.)
_STALE_TEMP_SECONDS = 300


def cache_dir() -> Path:
    """``CONVGEN_CACHE_DIR``, else the user cache folder + ``convgen``.

    The user cache folder is ``$XDG_CACHE_HOME`` when set to an absolute path,
    else ``~/.cache`` (``%LOCALAPPDATA%`` on Windows) -- the XDG rule, done by
    hand so platformdirs is not a dependency.
    """
    explicit = config.CACHE_DIR.path()
    if explicit is not None:
        return explicit
    if os.name == "nt" and os.environ.get("LOCALAPPDATA"):  # pragma: no cover
        return Path(os.environ["LOCALAPPDATA"]) / "convgen" / "cache"
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "convgen"


def _entry_path(key: str) -> Path:
    return cache_dir() / "kernels" / f"{key}.bin"


def _key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _pack(arch: str, payload: bytes, key: str) -> bytes:
    a = arch.encode()
    digest = hashlib.sha256(payload).digest()
    return _HEADER.pack(_MAGIC, FORMAT_TAG, len(a), _key_digest(key), digest, len(payload)) + a + payload


def _unpack(data: bytes, arch: str, key: str) -> bytes | None:
    """The payload, or None when anything (magic, format, key, arch, length, hash) is off.
    The key's hash binds an entry to its name: a valid entry of another kernel, renamed or
    copied to this key's file, is refused."""
    if len(data) < _HEADER.size:
        return None
    magic, fmt, alen, key_digest, digest, n = _HEADER.unpack_from(data)
    if magic != _MAGIC or fmt != FORMAT_TAG or key_digest != _key_digest(key):
        return None
    start = _HEADER.size + alen
    if data[_HEADER.size:start] != arch.encode() or len(data) != start + n:
        return None
    payload = data[start:]
    if hashlib.sha256(payload).digest() != digest:
        return None
    return payload


# Folders found unwritable in this process (skipped from then on), and whether the
# one warning has been given.
_unwritable: set[Path] = set()
_warned_unwritable = False


def _disk_failed(folder: Path, exc: OSError) -> None:
    global _warned_unwritable
    _unwritable.add(folder)
    if not _warned_unwritable:
        _warned_unwritable = True
        warnings.warn(
            f"convgen: kernel cache folder {folder} is not usable ({exc}); compiled kernels "
            "are kept in memory only for this process. Set CONVGEN_CACHE_DIR to a writable "
            "folder to cache them on disk.",
            RuntimeWarning,
            stacklevel=3,
        )


def _read_entry(path: Path, arch: str) -> bytes | None:
    """The payload of the entry at `path` (named by its key, see :func:`_entry_path`), or None;
    an entry that fails any check is deleted."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError:  # not a folder, no permission, I/O error: a miss
        return None
    payload = _unpack(data, arch, path.stem)
    if payload is None:  # corrupt, truncated, another key or another arch: never load it
        try:
            path.unlink()
        except OSError:
            pass
    return payload


def _write_entry(path: Path, arch: str, payload: bytes) -> None:
    """Publish an entry bound to its key (the file's stem), clearing writers' stale temps first."""
    try:
        _remove_stale_temps(path.parent)
        atomic_write(path, _pack(arch, payload, path.stem))
    except OSError as exc:
        _disk_failed(cache_dir(), exc)


def _remove_stale_temps(folder: Path) -> None:
    """Delete writers' temp files (``.NAME.PID.XXXX.tmp``) older than _STALE_TEMP_SECONDS: left
    by a process killed mid-write.  A live writer's file is younger, and is never touched."""
    cutoff = time.time() - _STALE_TEMP_SECONDS
    try:
        with os.scandir(folder) as it:
            for entry in it:
                if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                    try:
                        if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                            os.unlink(entry.path)
                    except OSError:  # gone already (another writer cleaned it), or not ours to remove
                        pass
    except OSError:
        pass


def unwritable_folders() -> set[Path]:
    """The cache folders this process found it cannot write (skipped from then on)."""
    return _unwritable
