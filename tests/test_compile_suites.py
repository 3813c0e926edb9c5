"""NVRTC compiles the CUDA kernels convgen emits for the built-in suites (no GPU needed).

Every layer of every suite (convgen.suites.SUITES), all three passes, on sm_90, with the
default epilogues (fprop bias, wgrad db); on the three suites the shipped database was
tuned on (suites.TUNED_ON) also float32 inputs and fused ReLU (fprop);
on the two CIFAR suites also float32 outputs and the forced scalar gather; on
cifar-resnet also fp32 scalar gathers and no bias/db; a grouped layer's kernel with its groups
packed into slabs (convgen/group_pack.py) as well as as it is.  sm_80 (less shared memory)
and sm_75 (no cp.async: the register-staged path) compile the CIFAR suites.  Each
result must be a cubin (ELF) holding exactly the kernels the launcher will look
up, built for the block size it launches with, within the register file.

Sources that differ only in comments and the kernel name (float32 inputs read
through a vector gather are cast first, so the code is the default's) are
compiled once.  Compilation fans out over a process pool (NVRTC holds the GIL,
so threads do not help) from one module-scoped fixture; the parametrized tests
only read the results.  About 200 CPU-seconds of NVRTC: some 100 s on two idle
cores (longer when the machine is shared).  `-rP` prints a resource report.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import struct
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import pytest

from convgen.emit import KernelSource, emit
from convgen.group_pack import kernel_problem
from convgen.ir import Epilogue, Pass, Target
from convgen.planner import make_spec
from convgen.suites import SUITES, TUNED_ON

pytest.importorskip("cupy", reason="NVRTC comes with CuPy")

ELF = b"\x7fELF"


@dataclass(frozen=True)
class Job:
    suite: str
    layer: str
    pass_: Pass
    variant: str
    arch: str

    @property
    def id(self) -> str:
        return f"{self.arch}/{self.suite}/{self.layer}/{self.pass_.value}/{self.variant}"


def variant_kwargs(pass_: Pass, variant: str) -> dict:
    bias = pass_ is not Pass.DGRAD  # the CLI's default: fprop adds a bias, wgrad returns db
    return {
        "default": dict(epilogue=Epilogue(bias=bias)),
        "in32": dict(epilogue=Epilogue(bias=bias), in_dtype="float32"),
        "out32": dict(epilogue=Epilogue(bias=bias, out_dtype="float32")),
        "relu": dict(epilogue=Epilogue(bias=bias, relu=True)),
        "scalar": dict(epilogue=Epilogue(bias=bias), scalar=True),
        "in32-scalar": dict(epilogue=Epilogue(bias=bias), in_dtype="float32", scalar=True),
        "nobias": dict(epilogue=Epilogue()),
        "packed": dict(epilogue=Epilogue(bias=bias)),
    }[variant]


def jobs() -> list[Job]:
    out = []
    for suite, layers in SUITES.items():
        cifar = suite.startswith("cifar")
        if suite not in TUNED_ON:  # the real-network suites: each pass's default kernel
            out += [Job(suite, layer.name, pass_, "default", "sm_90") for layer in layers for pass_ in Pass]
            # and the kernel a grouped layer runs with its groups packed (convgen/group_pack.py)
            out += [Job(suite, layer.name, pass_, "packed", "sm_90") for layer in layers for pass_ in Pass
                    if kernel_problem(layer.problem, pass_, "float16", Target("sm_90")) != layer.problem]
            continue
        for layer in layers:
            for pass_ in Pass:
                variants = ["default", "in32"] + (["relu"] if pass_ is Pass.FPROP else [])
                if cifar:  # the expensive variants (scalar gathers unroll a lot) on the small suites
                    variants += ["out32", "scalar"]
                if suite == "cifar-resnet":
                    variants += ["in32-scalar", "nobias"]
                out += [Job(suite, layer.name, pass_, v, "sm_90") for v in variants]
                if cifar:  # sm_80: less shared memory; sm_75: no cp.async, the register-staged path
                    out.append(Job(suite, layer.name, pass_, "default", "sm_80"))
                    out.append(Job(suite, layer.name, pass_, "default", "sm_75"))
                if suite == "cifar-resnet":
                    out.append(Job(suite, layer.name, pass_, "scalar", "sm_75"))
                    out.append(Job(suite, layer.name, pass_, "in32", "sm_75"))
    return out


JOBS = jobs()


def _layer(suite: str, name: str):
    return next(l for l in SUITES[suite] if l.name == name)


def _compile_job(source: str, arch: str, name: str) -> tuple[bytes | None, str, float]:
    """Runs in a worker process: (cubin or None, error text, CPU seconds of the compile)."""
    from convgen.compile import compile_binary

    t0 = time.process_time()  # NVRTC runs in this process: CPU time, not skewed by a busy machine
    try:
        return compile_binary(source, arch=arch, name=name), "", time.process_time() - t0
    except Exception as exc:  # CompileError carries the log and the dumped source path
        return None, f"{type(exc).__name__}: {exc}", time.process_time() - t0


@dataclass
class Result:
    source: KernelSource | None
    binary: bytes | None
    error: str
    seconds: float
    compiled_as: str = ""  # the main kernel name in the binary (another job's, when deduplicated)
    shared: bool = False  # the binary was compiled for another job with the same code


def code_only(source: str) -> str:
    source = re.sub(r"/\*.*?\*/", "", source, flags=re.S)
    return re.sub(r"//[^\n]*", "", source)


def dedup_key(arch: str, ks: KernelSource) -> tuple[str, str]:
    """Sources that differ only in comments, blank lines and the kernel name compile alike
    (e.g. float32 inputs with vector gathers: read as fp16 after a cast pass, the same code),
    so each distinct body is compiled once."""
    code = code_only(ks.source).replace(ks.main.kernel, "KERNEL")
    return arch, "\n".join(line.rstrip() for line in code.splitlines() if line.strip())


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, Result]:
    cache = tmp_path_factory.mktemp("convgen-cache")
    results: dict[str, Result] = {}
    with pytest.MonkeyPatch.context() as mp:
        # compile_binary has no cache, but a failure dumps the source under the cache folder:
        # keep that out of the user's real cache.  Spawned workers inherit the variable.
        mp.setenv("CONVGEN_CACHE_DIR", str(cache))
        pending = {}
        for job in JOBS:
            try:
                problem = _layer(job.suite, job.layer).problem
                pack = {}
                if job.variant == "packed":  # wgrad's kernel stores each filter's own channels (KernelSpec.pack)
                    slabs = kernel_problem(problem, job.pass_, "float16", Target(job.arch))
                    pack = dict(pack=problem.groups // slabs.groups) if job.pass_ is Pass.WGRAD else {}
                    problem = slabs
                spec = make_spec(problem, job.pass_, target=Target(job.arch),
                                 **variant_kwargs(job.pass_, job.variant), **pack)
                pending[job.id] = emit(spec)
            except Exception as exc:  # an emission bug fails that job's test, not the whole module
                results[job.id] = Result(None, None, f"emit failed: {type(exc).__name__}: {exc}", 0.0)
        workers = max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 16))
        ctx = multiprocessing.get_context("spawn")  # no fork after CuPy (or a CUDA context) is loaded
        groups: dict[tuple[str, str], list[str]] = {}
        for k, ks in pending.items():
            groups.setdefault(dedup_key(JOBS_BY_ID[k].arch, ks), []).append(k)
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            # biggest sources first: better packing of the long compiles
            reps = sorted((members[0] for members in groups.values()), key=lambda k: -len(pending[k].source))
            futures = {k: pool.submit(_compile_job, pending[k].source, pending[k].compile_arch, pending[k].filename)
                       for k in reps}
            for members in groups.values():
                rep = members[0]
                binary, error, seconds = futures[rep].result()
                for k in members:
                    results[k] = Result(pending[k], binary, error, seconds if k == rep else 0.0,
                                        compiled_as=pending[rep].main.kernel, shared=k != rep)
    return results


JOBS_BY_ID = {j.id: j for j in JOBS}


# --------------------------------------------------------------------------- cubin reading


def cubin_kernels(binary: bytes) -> dict[str, dict[str, int]]:
    """Per-kernel resources from a cubin's ELF: registers, stack frame and the launch bound.

    `.text.NAME` sections are the kernels; the `.nv.info` section holds EIATTR
    records (format byte, attribute byte, then a value): REGCOUNT (0x2f) and
    FRAME_SIZE (0x11) as (symbol index, value); `.nv.info.NAME` holds MAX_THREADS
    (0x05, from __launch_bounds__) as three u32.  Unknown record formats end the walk.
    """
    assert binary[:4] == ELF and binary[4] == 2 and binary[5] == 1, "64-bit little-endian ELF"
    shoff = struct.unpack_from("<Q", binary, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", binary, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", binary, shoff + i * shentsize) for i in range(shnum)]

    def cstr(table_off: int, off: int) -> str:
        end = binary.index(b"\0", table_off + off)
        return binary[table_off + off:end].decode()

    names = [cstr(secs[shstrndx][4], s[0]) for s in secs]
    kernels = {n[len(".text."):]: {} for n in names if n.startswith(".text.")}

    symbols: dict[int, str] = {}
    for s in secs:
        if s[1] == 2:  # SHT_SYMTAB
            strtab_off = secs[s[6]][4]
            for i in range(s[5] // 24):
                st_name = struct.unpack_from("<I", binary, s[4] + 24 * i)[0]
                symbols[i] = cstr(strtab_off, st_name)

    def records(sec):
        data = binary[sec[4]:sec[4] + sec[5]]
        i = 0
        while i + 4 <= len(data):
            fmt, attr = data[i], data[i + 1]
            if fmt == 4:  # EIFMT_SVAL: u16 size, then the value
                size = struct.unpack_from("<H", data, i + 2)[0]
                yield attr, data[i + 4:i + 4 + size]
                i += 4 + size
            elif fmt in (1, 2, 3):  # no value / byte / half-word: one 4-byte record
                yield attr, data[i + 2:i + 4]
                i += 4
            else:
                return

    for name, sec in zip(names, secs):
        if name == ".nv.info":
            for attr, value in records(sec):
                if attr in (0x2F, 0x11) and len(value) == 8:
                    sym, v = struct.unpack("<II", value)
                    kname = symbols.get(sym)
                    if kname in kernels:
                        kernels[kname]["registers" if attr == 0x2F else "frame"] = v
        elif name.startswith(".nv.info."):
            kname = name[len(".nv.info."):]
            for attr, value in records(sec):
                if attr == 0x05 and len(value) == 12 and kname in kernels:
                    kernels[kname]["max_threads"] = struct.unpack("<III", value)[0]
    return kernels


# --------------------------------------------------------------------------- tests


def test_every_suite_layer_and_pass_is_covered():
    default_sm90 = {(j.suite, j.layer, j.pass_) for j in JOBS if j.arch == "sm_90" and j.variant == "default"}
    assert default_sm90 == {(s, l.name, p) for s, layers in SUITES.items() for l in layers for p in Pass}
    # the float32-input and ReLU variants on the suites the shipped database was tuned on
    in32 = {(j.suite, j.layer, j.pass_) for j in JOBS if j.arch == "sm_90" and j.variant == "in32"}
    assert in32 == {(s, l.name, p) for s in TUNED_ON for l in SUITES[s] for p in Pass}
    relu = {(j.suite, j.layer) for j in JOBS if j.variant == "relu" and j.pass_ is Pass.FPROP}
    assert relu == {(s, l.name) for s in TUNED_ON for l in SUITES[s]}
    for variant in ("out32", "scalar"):
        assert {j.suite for j in JOBS if j.variant == variant} == {"cifar-resnet", "cifar-vgg"}
    assert {j.arch for j in JOBS} == {"sm_90", "sm_80", "sm_75"}
    packed = {(j.suite, j.layer, j.pass_) for j in JOBS if j.variant == "packed"}
    assert packed >= {("resnext50-grouped", l.name, p) for l in SUITES["resnext50-grouped"]  # slabs of a box
                      for p in (Pass.FPROP, Pass.WGRAD)}
    assert packed >= {("resnext50-grouped", l.name, Pass.DGRAD) for l in SUITES["resnext50-grouped"]
                      if l.problem.c // l.problem.groups < 32}  # slabs of 32 channels, or one dense layer


@pytest.mark.parametrize("job_id", [j.id for j in JOBS])
def test_kernel_compiles_to_a_cubin(job_id, compiled):
    r = compiled[job_id]
    assert r.binary is not None, f"{job_id}: {r.error}"
    assert r.binary[:4] == ELF, f"{job_id}: not an ELF cubin ({r.binary[:16]!r})"
    ks = r.source
    kernels = {name.replace(r.compiled_as, ks.main.kernel): res for name, res in cubin_kernels(r.binary).items()}
    assert set(kernels) == set(ks.kernel_names), f"{job_id}: cubin has {sorted(kernels)}"
    for launch in [ks.main] + ([ks.reduce] if ks.reduce else []):
        res = kernels[launch.kernel]
        threads = launch.block[0] * launch.block[1] * launch.block[2]
        if "max_threads" in res:  # __launch_bounds__ must allow the block the launcher uses
            assert res["max_threads"] >= threads, f"{launch.kernel}: launch bound {res['max_threads']} < {threads}"
        if "registers" in res:
            assert res["registers"] <= 255
            assert res["registers"] * threads <= 64 * 1024, f"{launch.kernel}: {res['registers']} registers x {threads}"


def test_resource_report(compiled):
    """Not a gate: registers and stack frame (local memory: spills or arrays) per kernel,
    summarised per arch and variant (shown with -rP)."""
    table: dict[tuple[str, str], list[tuple[int, int, str]]] = {}
    for job_id, r in compiled.items():
        if r.binary is None or r.shared:
            continue
        job = JOBS_BY_ID[job_id]
        for name, res in cubin_kernels(r.binary).items():
            if not name.endswith("_reduce"):
                table.setdefault((job.arch, job.variant), []).append(
                    (res.get("frame", -1), res.get("registers", -1), job_id, r.seconds))
    assert table
    total = sum(r.seconds for r in compiled.values())
    unique = sum(not r.shared for r in compiled.values())
    print(f"\n{len(compiled)} kernels ({unique} distinct compiles), {total:.0f} CPU s of NVRTC")
    print("arch   variant       compiles  CPU s  max regs  with stack  max stack")
    for (arch, variant), rows in sorted(table.items()):
        print(f"{arch:6} {variant:13} {len(rows):8d} {sum(r[3] for r in rows):6.1f} {max(r[1] for r in rows):9d} "
              f"{sum(r[0] > 0 for r in rows):11d} {max(r[0] for r in rows):8d} B")
    worst = sorted((row for rows in table.values() for row in rows), reverse=True)[:8]
    for frame, regs, job_id, _ in worst:
        print(f"  {frame:5d} B stack, {regs:3d} registers: {job_id}")
