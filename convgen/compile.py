"""Run-time compilation: generated CUDA (or HIP) source -> device binary -> CuPy functions.

``import convgen.compile`` is how users compile at run time.  The pipeline is

    source --NVRTC--> cubin (SASS for one exact arch) --cuModuleLoadData--> cupy Function

with two caches in front of NVRTC:

* an in-memory cache (binaries, and modules already loaded on each device), so
  a training loop that asks for the same kernel every step pays a dict lookup;
* an on-disk cache (modelled on Triton's; convgen/kernel_store.py), so a new process does not pay the
  NVRTC time again.  Entries are keyed by a sha256 over everything that can
  change the binary (see :func:`cache_key`) and carry a header (the key's hash,
  the arch, the payload's length and sha256) that is checked on every read, so a
  torn, corrupt, wrong-arch or renamed file is deleted and rebuilt, never loaded.

Design choices, and why:

* **Real SASS, never PTX.**  ``--gpu-architecture=sm_XY`` makes NVRTC emit a
  cubin for exactly that arch.  PTX would be JIT-compiled by the driver on first
  load (slow, and rejected by a driver older than the NVRTC that made it), and
  a cubin can be produced on a machine with no GPU (CI, a build box).
* **Headers are looked up by hand.**  NVRTC has most CUDA headers built in, but
  not ``<mma.h>`` (WMMA), which includes ``crt/mma.h``.  With a pip-installed
  CUDA (no toolkit), CuPy finds no CUDA path and passes no ``-I``; see
  :func:`~convgen.cuda_headers.cuda_include_dirs` (convgen/cuda_headers.py).
* **Writes are atomic, with no locks.**  Each writer writes its own temp file in
  the cache directory, fsyncs it and ``os.replace``-s it into place.  Two
  processes compiling the same kernel both write identical bytes and the last
  rename wins; a killed process leaves at worst a stray temp file, never a lock
  that would hang the next run, and the next write removes temp files older
  than five minutes.
* **Warnings are not dropped.**  NVRTC's log of a kernel that compiled is
  checked: a warning (once the always-benign #177-D is suppressed) is a
  :class:`CompilerWarning`, or a :class:`CompileError` with ``CONVGEN_WERROR=1``,
  which the test suite sets.
* **The disk is optional.**  If the cache directory cannot be created or written
  (read-only home, full disk), compilation still works, memory-only, with one
  warning per process.
* **CuPy is imported lazily**, inside functions, so ``import convgen`` and
  ``import convgen.compile`` work on a machine without CuPy (code generation,
  docs, tests that only render source).

What CuPy (checked against cupy-cuda13x 14.2) offers, and what is used here:

* NVRTC: ``cupy.cuda.nvrtc`` (= ``cupy_backends.cuda.libs.nvrtc``) exposes
  ``createProgram(src, name, headers, include_names)``,
  ``compileProgram(prog, options)`` (raises ``NVRTCError``),
  ``getProgramLog``, ``getCUBIN``, ``getPTX``, ``destroyProgram`` and
  ``getVersion() -> (major, minor)`` (e.g. ``(13, 5)``; it reads the loaded
  libnvrtc, no GPU needed).  On a ROCm build of CuPy the same module is backed
  by hiprtc (``getCUBIN`` returns the code object).  ``import cupy`` must come
  before ``from cupy.cuda import nvrtc``: importing the submodule first hits a
  circular import inside CuPy 14.
* Loading: ``cupy.cuda.function.Module().load(data: bytes)`` calls
  ``cuModuleLoadData`` after ``runtime._ensure_context()``; ``Module.get_function(name)``
  returns a ``cupy.cuda.function.Function`` (which keeps its Module alive),
  launched as ``fn(grid, block, args, shared_mem=0, stream=None)``.
  ``cupy.RawModule`` only takes source or a file *path*, so it is not used.
* Dynamic shared memory above 48 KiB: ``cupy.RawKernel`` has a
  ``max_dynamic_shared_size_bytes`` property, but the plain ``Function`` that a
  ``Module`` returns has **no** such attribute.  The driver call is exposed:
  ``cupy.cuda.driver.funcSetAttribute(fn.ptr,
  cupy.cuda.driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)``;
  :func:`set_max_dynamic_shared_memory` wraps it (and the HIP equivalent).
"""

from __future__ import annotations

import hashlib
import re
import struct
import tempfile
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from . import config, kernel_store
from .cuda_headers import cuda_include_dirs, hip_include_dirs
from .kernel_store import FORMAT_TAG, _entry_path, _read_entry, _write_entry, cache_dir  # noqa: F401 (FORMAT_TAG, cache_dir: public here too)

if TYPE_CHECKING:  # pragma: no cover - type hints only; CuPy is imported lazily
    import cupy

    from convgen.ir import Target

__all__ = [
    "CompileError",
    "CompilerWarning",
    "HeaderNotFoundError",
    "DeviceError",
    "cuda_include_dirs",
    "hip_include_dirs",
    "nvrtc_version",
    "compile_binary",
    "cached_binary",
    "cache_key",
    "load_kernels",
    "local_bytes",
    "set_max_dynamic_shared_memory",
    "cache_dir",
    "detect_target",
    "clear_memory_cache",
    "FORMAT_TAG",
]

_CUDA_STD = "-std=c++17"
# NVRTC's #177-D, "declared but never referenced": the prelude defines helpers (and Map
# members) that a given kernel may not use.  Suppressed so that any warning left is news.
_CUDA_DIAG = "--diag-suppress=177"


# --------------------------------------------------------------------------- errors


class CompileError(RuntimeError):
    """The device compiler rejected a kernel (or could not run at all).

    ``log`` is the compiler's log, ``source_path`` a dumped copy of the source
    (so the line numbers in the log can be read), ``options`` the exact options.
    """

    def __init__(
        self,
        message: str,
        *,
        log: str = "",
        source_path: Path | None = None,
        options: Sequence[str] = (),
    ) -> None:
        self.message = message
        self.log = log
        self.source_path = source_path
        self.options = tuple(options)
        super().__init__(message)

    def __str__(self) -> str:
        parts = [self.message]
        if self.source_path is not None:
            parts.append(f"source: {self.source_path}")
        if self.options:
            parts.append("options: " + " ".join(self.options))
        if self.log.strip():
            parts.append("compiler log:\n" + self.log.strip())
        return "\n".join(parts)


class HeaderNotFoundError(CompileError):
    """The CUDA/HIP headers that the kernels include could not be found; the
    message says which package or environment variable fixes it."""


class CompilerWarning(UserWarning):
    """NVRTC (hiprtc) compiled a kernel but warned: the warning and the whole log."""


class DeviceError(RuntimeError):
    """No usable GPU (none present, no driver, or an arch convgen does not support)."""


# --------------------------------------------------------------------------- backend


def _cupy():
    """Import CuPy (lazily) with a message that says how to get it."""
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise ImportError(
            "convgen.compile needs CuPy: pip install 'convgen[cuda13]' (CUDA 13), "
            "'convgen[cuda12]' (CUDA 12), or a ROCm build of CuPy"
        ) from exc
    return cupy


def _nvrtc():
    _cupy()  # CuPy 14: `cupy` must be imported before `cupy.cuda.nvrtc` (circular import)
    from cupy.cuda import nvrtc

    return nvrtc


def _is_hip() -> bool:
    _cupy()
    from cupy.cuda import runtime

    return bool(runtime.is_hip)


_lock = threading.RLock()
_nvrtc_version: tuple[int, int] | None = None


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the loaded NVRTC (hiprtc on ROCm).  Needs no GPU."""
    global _nvrtc_version
    if _nvrtc_version is None:
        major, minor = _nvrtc().getVersion()
        _nvrtc_version = (int(major), int(minor))
    return _nvrtc_version


_CUDA_ARCH = re.compile(r"sm_\d+[af]?\Z")
_HIP_ARCH = re.compile(r"gfx[0-9a-f]+(:[a-z0-9_-]+[+-])*\Z")


def _arch_flag(arch: str, hip: bool) -> str:
    """The compiler flag for `arch`, refusing anything that would not give a real binary."""
    if hip:
        if not _HIP_ARCH.match(arch):
            raise ValueError(f"CuPy is a ROCm build: arch must look like 'gfx1100', got {arch!r}")
        return f"--offload-arch={arch}"
    if not _CUDA_ARCH.match(arch):
        raise ValueError(
            f"arch must be a real CUDA arch like 'sm_90' (a cubin, not PTX for "
            f"'compute_XY'), got {arch!r}"
            + ("; 'gfx…' archs need a ROCm build of CuPy" if arch.startswith("gfx") else "")
        )
    return f"--gpu-architecture={arch}"


def _fixed_flags(arch: str, hip: bool) -> list[str]:
    """Flags convgen always passes, independent of where the headers are (so part of the key)."""
    return [_arch_flag(arch, hip), _CUDA_STD] + ([] if hip else [_CUDA_DIAG])


# --------------------------------------------------------------------------- compile


def _dump_failed(source: str, name: str, log: str) -> Path:
    """Write the failing source (and log) where a human can open it; never raises."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name) or "kernel.cu"
    for folder in (cache_dir() / "failed", None):
        try:
            if folder is None:
                folder = Path(tempfile.mkdtemp(prefix="convgen-failed-"))
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{digest}-{safe}"
            path.write_text(source)
            path.with_name(path.name + ".log").write_text(log)
            return path
        except OSError:
            continue
    return Path(tempfile.gettempdir()) / f"{digest}-{safe}"  # pragma: no cover - no writable dir


def _elf_extent(binary: bytes) -> int | None:
    """Where a 64-bit little-endian ELF's header says the file ends (past its program- or
    section-header table), or None for anything else."""
    if len(binary) < 64 or binary[:4] != b"\x7fELF" or binary[4] != 2 or binary[5] != 1:
        return None
    phoff, shoff = struct.unpack_from("<QQ", binary, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", binary, 0x36)
    return max(phoff + phentsize * phnum, shoff + shentsize * shnum)


def _whole_elf(binary: bytes) -> bytes:
    """`binary` with the byte CuPy's ``getCUBIN`` drops restored.

    CuPy returns the binary less its last byte, as if it were NUL-terminated text like
    PTX.  The driver still loads it, because it reads one byte past the end and finds
    the NUL that follows every Python bytes object.  But the file is not a valid ELF,
    and tools such as ``cuobjdump`` reject it.  When the ELF header proves the file is
    exactly one byte longer than what we got, the byte is put back.  It is the last
    byte of the program- or section-header table, the top byte of an alignment or
    entry size, so it is zero, the same byte the driver was reading.
    """
    end = _elf_extent(binary)  # None (not an ELF we know): left alone
    return binary + b"\0" if end == len(binary) + 1 else binary


def _nvrtc_compile(source: str, name: str, options: list[str]) -> tuple[bytes | None, str]:
    """One NVRTC (or hiprtc) run: (binary or None on failure, log)."""
    nvrtc = _nvrtc()
    prog = nvrtc.createProgram(source, name, [], [])
    try:
        try:
            nvrtc.compileProgram(prog, options)
        except nvrtc.NVRTCError:
            return None, nvrtc.getProgramLog(prog)
        return _whole_elf(nvrtc.getCUBIN(prog)), nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)


def compile_binary(
    source: str, *, arch: str, options: Sequence[str] = (), name: str = "kernel.cu"
) -> bytes:
    """Compile `source` to a device binary for exactly `arch` (``"sm_90"``: a cubin of SASS).

    Works with no GPU: NVRTC only needs the headers.  Options passed are the
    arch flag, ``-std=c++17``, one ``-I`` per include folder, then `options`.
    On failure raises :class:`CompileError` with the log and a dumped copy of
    the source.  No caching here; see :func:`cached_binary` and :func:`load_kernels`.
    """
    hip = _is_hip()
    from .resources import include_dir

    # convgen's own device header first (convgen/device.h; its bytes are in the cache key
    # through resources.templates_hash), then the toolkit's.
    includes = [str(include_dir())] + (hip_include_dirs() if hip else cuda_include_dirs())
    opts = _fixed_flags(arch, hip) + [f"-I{d}" for d in includes] + list(options)
    binary, log = _nvrtc_compile(source, name, opts)
    what = "hiprtc" if hip else "NVRTC"
    if not binary:
        first = next((ln for ln in log.splitlines() if "error" in ln), "").strip()
        raise CompileError(
            f"{what} failed to compile {name} for {arch}" + (f": {first}" if first else ""),
            log=log,
            source_path=_dump_failed(source, name, log),
            options=opts,
        )
    warning = next((ln.strip() for ln in log.splitlines() if "warning" in ln.lower()), "")
    if warning:
        message = f"{what} warned compiling {name} for {arch}: {warning}"
        if _warnings_are_errors():
            raise CompileError(message + " (CONVGEN_WERROR=1 makes compiler warnings errors)", log=log,
                               source_path=_dump_failed(source, name, log), options=opts)
        warnings.warn(CompilerWarning(message + "\n" + log.strip()), stacklevel=2)
    return bytes(binary)


def _warnings_are_errors() -> bool:
    """``CONVGEN_WERROR=1``: a compiler warning fails the compile (the test suite sets it, so an
    emitted kernel that makes NVRTC warn, e.g. of an int overflow, fails its test)."""
    return config.WERROR.enabled()


# --------------------------------------------------------------------------- caches (the disk store: convgen/kernel_store.py)


def cache_key(source: str, *, arch: str, options: Sequence[str] = ()) -> str:
    """sha256 (hex) over everything that can change the binary.

    That is: the format tag, the backend, the exact arch, the include-folder-
    independent flags and the caller's options (in order), the NVRTC/hiprtc
    version, convgen's version, the templates' hash and the source.  The
    include folders themselves are left out, so one cache serves a toolkit and
    pip headers alike (the compiler version is in the key).
    """
    import convgen
    from convgen import resources

    hip = _is_hip()
    fields = [
        f"format={kernel_store.FORMAT_TAG}",
        "hip" if hip else "cuda",
        arch,
        "\0".join(_fixed_flags(arch, hip) + list(options)),
        "%d.%d" % nvrtc_version(),
        str(convgen.__version__),
        resources.templates_hash(),
        source,
    ]
    h = hashlib.sha256()
    for f in fields:  # length-prefixed: no two field lists hash alike
        b = f.encode()
        h.update(len(b).to_bytes(8, "little") + b)
    return h.hexdigest()


_binaries: dict[tuple, bytes] = {}
_modules: dict[tuple, object] = {}


def cached_binary(
    source: str, *, arch: str, options: Sequence[str] = (), name: str = "kernel.cu"
) -> bytes:
    """:func:`compile_binary` behind the memory and disk caches.  Needs no GPU, so it
    also pre-compiles (warms the disk cache) on a build machine."""
    hip = _is_hip()
    mem_key = ("hip" if hip else "cuda", arch, tuple(options), source)
    with _lock:
        hit = _binaries.get(mem_key)
        if hit is not None:
            return hit
    binary: bytes | None = None
    folder = cache_dir()
    use_disk = folder not in kernel_store.unwritable_folders()
    path = _entry_path(cache_key(source, arch=arch, options=options)) if use_disk else None
    if path is not None:
        binary = _read_entry(path, arch)
    if binary is None:
        binary = compile_binary(source, arch=arch, options=options, name=name)
        if path is not None:
            _write_entry(path, arch, binary)
    with _lock:
        _binaries[mem_key] = binary
    return binary


def compile_async(sources: Sequence[tuple[str, str]], workers: int | None = None) -> list:
    """Start compiling each ``(source, arch)`` into the caches (:func:`cached_binary`) on
    threads; returns one future per source (its result the binary, or the CompileError).
    NVRTC runs outside Python's lock (two kernels on two threads took half the time of one
    after the other), so threads compile side by side with no interpreter to start.  The
    pool does not wait for its work: a compile nobody waits for runs on and warms the cache."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=max(1, min(len(sources), workers or os.cpu_count() or 4)),
                              thread_name_prefix="convgen-compile")
    futures = [pool.submit(cached_binary, src, arch=arch) for src, arch in sources]
    pool.shutdown(wait=False)
    return futures


def clear_memory_cache() -> None:
    """Forget the binaries and loaded modules this process holds (the disk cache stays)."""
    with _lock:
        _binaries.clear()
        _modules.clear()


# --------------------------------------------------------------------------- load


def _device_arch(cupy_mod, device_id: int) -> str:
    from cupy.cuda import runtime

    if runtime.is_hip:
        name = runtime.getDeviceProperties(device_id)["gcnArchName"]
        if isinstance(name, bytes):
            name = name.decode()
        return name.split(":")[0]
    return "sm_" + cupy_mod.cuda.Device(device_id).compute_capability


def _current_device() -> int:
    cupy = _cupy()
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        raise DeviceError(f"no usable GPU: {exc.__class__.__name__}: {exc}") from exc
    if count < 1:
        raise DeviceError("no usable GPU: the device count is 0")
    return cupy.cuda.Device().id


def load_kernels(
    source: str,
    kernel_names: Sequence[str],
    *,
    arch: str | None = None,
    options: Sequence[str] = (),
) -> dict[str, "cupy.cuda.Function"]:
    """Compile (or fetch from cache) and load `source` on the current device.

    `kernel_names` must be ``extern "C"`` names (NVRTC mangles C++ names).
    `arch` None means the current device's exact arch.  Memory cache, then disk
    cache, then :func:`compile_binary`.  Returns ``{name: cupy.cuda.function.Function}``;
    launch as ``fn(grid, block, args, shared_mem=nbytes)`` and raise the dynamic
    shared memory limit with :func:`set_max_dynamic_shared_memory`.
    """
    cupy = _cupy()
    from cupy.cuda import function

    device_id = _current_device()
    if arch is None:
        arch = _device_arch(cupy, device_id)
    mod_key = (device_id, arch, tuple(options), source)
    with _lock:
        module = _modules.get(mod_key)
    if module is None:
        binary = cached_binary(source, arch=arch, options=options)
        module = function.Module()
        try:
            module.load(binary)
        except Exception as exc:
            live = _device_arch(cupy, device_id)
            raise CompileError(
                f"loading the {arch} binary on device {device_id} ({live}) failed: {exc}"
                + (f"; it was built for {arch}, not {live}" if live != arch else "")
            ) from exc
        with _lock:
            module = _modules.setdefault(mod_key, module)
    out = {}
    for kname in kernel_names:
        try:
            out[kname] = module.get_function(kname)
        except Exception as exc:
            raise KeyError(
                f"kernel {kname!r} not found in the compiled module ({exc}); "
                'is it declared extern "C" __global__?'
            ) from None
    return out


def set_max_dynamic_shared_memory(fn: "cupy.cuda.Function", nbytes: int) -> None:
    """Allow `fn` to be launched with up to `nbytes` of dynamic shared memory.

    Above 48 KiB a kernel must opt in (``cudaFuncAttributeMaxDynamicSharedMemorySize``).
    ``cupy.cuda.function.Function`` has no property for it (only ``RawKernel``
    does), so this calls ``cuFuncSetAttribute`` through ``cupy.cuda.driver``.
    """
    _cupy()
    from cupy.cuda import driver

    driver.funcSetAttribute(
        fn.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(nbytes)
    )


def resident_blocks(fn: "cupy.cuda.Function", threads: int, shared_mem: int, device_id: int) -> int:
    """How many blocks of `fn` (``threads`` a block, ``shared_mem`` dynamic bytes) the whole
    GPU holds at once, as the driver counts them (registers, shared memory, threads): the
    most a cooperative launch may have."""
    cupy = _cupy()
    from cupy.cuda import driver

    per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.ptr, int(threads), int(shared_mem))
    return int(per_sm) * int(cupy.cuda.runtime.getDeviceProperties(device_id)["multiProcessorCount"])


def local_bytes(fn: "cupy.cuda.Function") -> int:
    """Bytes of local memory per thread the loaded kernel uses: register spills (and any
    array the compiler could not keep in registers).  `convgen tune` refuses such plans."""
    _cupy()
    from cupy.cuda import driver

    return int(driver.funcGetAttribute(driver.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, fn.ptr))


def gpu_unavailable_reason() -> str | None:
    """None when CuPy sees a CUDA GPU, else why not (for skip reasons and CLI messages):
    "no CUDA device ..." or "driver too old ...", then the runtime's own error."""
    try:
        cupy = _cupy()
        runtime = cupy.cuda.runtime
        count = runtime.getDeviceCount()
    except Exception as exc:  # ImportError, a broken CUDA install, no driver
        return _no_gpu_reason(exc)
    if count < 1:
        return "no CUDA device: the device count is 0"
    return None


_CUDA_ERROR_INSUFFICIENT_DRIVER, _CUDA_ERROR_NO_DEVICE = 35, 100


def _no_gpu_reason(exc: Exception) -> str:
    """CUDA's runtime reports a machine with no driver at all as cudaErrorInsufficientDriver,
    the same error as an old driver; the driver's version (0: none installed) tells them apart."""
    raw = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ImportError):
        return raw
    try:
        from cupy.cuda import runtime

        if runtime.is_hip:
            return raw
        driver, needed = int(runtime.driverGetVersion()), int(runtime.runtimeGetVersion())
    except Exception:
        return raw
    status = getattr(exc, "status", None)
    if driver == 0:
        return f"no CUDA device: no NVIDIA driver is installed ({raw})"
    if status == _CUDA_ERROR_NO_DEVICE:
        return f"no CUDA device: the NVIDIA driver (CUDA {_cuda_ver(driver)}) sees no GPU ({raw})"
    if status == _CUDA_ERROR_INSUFFICIENT_DRIVER:
        return (f"driver too old: the NVIDIA driver supports CUDA {_cuda_ver(driver)}, CuPy's runtime is CUDA "
                f"{_cuda_ver(needed)}; update the driver or install the CuPy build of its CUDA major ({raw})")
    return raw


def _cuda_ver(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def detect_target() -> "Target":
    """The :class:`convgen.ir.Target` of the current GPU: exact arch and SM count.

    Raises :class:`DeviceError` when there is no usable GPU or its arch is not in
    :data:`convgen.ir.ARCHES`.
    """
    from convgen.ir import ARCHES, Target

    cupy = _cupy()
    device_id = _current_device()
    arch = _device_arch(cupy, device_id)
    if arch not in ARCHES:
        raise DeviceError(
            f"device {device_id} is {arch}, which convgen does not support; "
            f"supported: {', '.join(ARCHES)}"
        )
    sm_count = int(cupy.cuda.runtime.getDeviceProperties(device_id)["multiProcessorCount"])
    return Target(arch=arch, sm_count=sm_count)
