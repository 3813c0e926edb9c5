"""`convgen sass`: what the compiler made of a kernel, read without a GPU.

Speed problems show in the SASS before any GPU time is spent: a gather that lost its
16-byte copies, a main loop without tensor-core MMAs, registers spilled to local memory.
This compiles the kernels with NVRTC (no GPU needed) and reads the cubins back with
``cuobjdump`` (the ``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm`` wheels of the
cuda13 or cuda12 extra, or a CUDA toolkit). It reports registers, the stack frame, and the
instructions that matter:
- HMMA: tensor-core MMAs.
- LDGSTS: cp.async, and how many of them move 16 bytes.
- LDG/STG: global loads and stores, and their 16-byte share.
- LDSM: ldmatrix.
- LDL/STL: local memory, that is, spills.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .. import config, tuning_db
from .cli_common import (UsageError, add_shape_args, add_target_args, as_run, dtypes, epilogue, layers, passes,
                         target)

_FUNCTION = re.compile(r"^\s*Function : (\S+)\s*$", re.M)
_OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)")
_RESOURCES = re.compile(r"Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+)")


@dataclass(frozen=True)
class KernelSass:
    """One kernel's registers, stack frame and SASS instruction mix."""

    name: str
    registers: int
    stack: int
    opcodes: Counter = field(repr=False)

    def count(self, prefix: str, width: Optional[str] = None) -> int:
        """Instructions whose opcode is `prefix` (before its first dot), with `.width` among its modifiers if given."""
        return sum(n for op, n in self.opcodes.items()
                   if op.split(".")[0] == prefix and (width is None or width in op.split(".")[1:]))

    @property
    def total(self) -> int:
        return sum(self.opcodes.values())

    @property
    def local(self) -> int:
        return self.count("LDL") + self.count("STL")


def find_cuobjdump() -> Optional[str]:
    """``CONVGEN_CUOBJDUMP``, else ``cuobjdump`` on the PATH, else one from the pip wheels."""
    explicit = config.CUOBJDUMP.get()
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which("cuobjdump")
    if found:
        return found
    for root in sys.path:
        for path in sorted(glob.glob(os.path.join(root, "nvidia", "*", "bin", "cuobjdump"))):
            if os.access(path, os.X_OK):
                return path
    return None


def read_cubin(binary: bytes, cuobjdump: str) -> dict[str, KernelSass]:
    """Every kernel of a cubin, by name."""
    env = dict(os.environ)
    env["PATH"] = str(Path(cuobjdump).parent) + os.pathsep + env.get("PATH", "")  # cuobjdump runs nvdisasm
    with tempfile.TemporaryDirectory(prefix="convgen-sass-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(binary)

        def run(flag: str) -> str:
            done = subprocess.run([cuobjdump, flag, str(path)], capture_output=True, text=True, env=env)
            if done.returncode != 0:
                raise RuntimeError(f"{cuobjdump} {flag} failed: {done.stderr.strip() or done.stdout.strip()}")
            return done.stdout

        resources = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in _RESOURCES.finditer(run("-res-usage"))}
        sass = run("-sass")
    parts = _FUNCTION.split(sass)  # [preamble, name1, body1, name2, body2, ...]
    kernels = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        regs, stack = resources.get(name, (-1, -1))
        kernels[name] = KernelSass(name, regs, stack, Counter(m.group(1) for m in _OPCODE.finditer(body)))
    return kernels


def kernel_sass(source: Any, cuobjdump: str) -> dict[str, KernelSass]:
    """Compile an emitted :class:`~convgen.emit.KernelSource` (disk cache and all) and read it back."""
    return source_sass(source.source, source.compile_arch, cuobjdump)


def source_sass(source: str, arch: str, cuobjdump: str) -> dict[str, KernelSass]:
    """:func:`kernel_sass` on plain values, so a process pool can run many side by side
    (NVRTC and cuobjdump each use one CPU)."""
    from ..compile import cached_binary

    return read_cubin(cached_binary(source, arch=arch), cuobjdump)


# ---------------------------------------------------------------------- the command
def add_parser(sub: Any) -> None:
    p = sub.add_parser("sass", help="compile (no GPU) and report registers, spills and the SASS instruction mix",
                       conflict_handler="resolve")
    add_shape_args(p)
    add_target_args(p)
    p.add_argument("--tuned", metavar="GPU", help="use GPU's tuned plans where its database has one (e.g. 'NVIDIA H200')")
    p.set_defaults(func=cmd_sass)


def cmd_sass(args: argparse.Namespace) -> int:
    from ..emit import emit
    from ..planner import make_spec

    tgt = target(args)
    dtypes(args)
    if tgt.backend != "cuda":
        raise UsageError("convgen sass reads CUDA cubins; for HIP targets see scripts/hip_check.sh")
    if args.tuned and not tuning_db.has_database(args.tuned):
        shipped = ", ".join(tuning_db.shipped_gpus()) or "none"
        raise UsageError(f"--tuned: no tuning database has plans for {args.tuned!r} (looked in "
                         f"{tuning_db.user_db_path()} and {tuning_db.shipped_db_path(args.tuned)}; shipped "
                         f"databases: {shipped}); run `convgen tune` on that GPU, or leave out --tuned")
    work = [(layer, pass_) for layer in layers(args) for pass_ in passes(args)]  # usage errors first
    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        print("convgen sass: no cuobjdump found (install the cuda13 or cuda12 extra, or a CUDA toolkit, "
              "or set CONVGEN_CUOBJDUMP)", file=sys.stderr)
        return 1
    print(f"{'layer':12s} {'pass':5s} {'plan':33s} {'regs':>4s} {'stack':>5s} {'instrs':>6s} {'HMMA':>5s} "
          f"{'cp.async':>8s} {'/16B':>5s} {'LDG':>4s} {'STG':>4s} {'/16B':>5s} {'LDSM':>4s} {'LDL+STL':>7s}")
    for layer, pass_ in work:
        tuned = (tuning_db.lookup(args.tuned, layer.problem.geometry, pass_, args.in_dtype, tgt.arch)
                 if args.tuned else None)
        spec = make_spec(layer.problem, pass_, target=tgt, epilogue=epilogue(args, pass_),
                         in_dtype=args.in_dtype, plan_=tuned, mma_dtype=args.dtype)
        if tuned is None:  # the kernel convgen.conv2d & co. run: a stem's channels padded, groups packed
            spec, _ = as_run(layer.problem, pass_, spec, args.in_dtype, args.dtype)
        src = emit(spec)
        k = kernel_sass(src, cuobjdump)[src.main.kernel]
        p = spec.plan
        g = spec.geometry
        plan = (f"{p.block_m}x{p.block_n}x{p.block_k} s{p.stages} v{p.vec_a}/{p.vec_b} k{p.split_k}"
                + p.layout() + (" tuned" if tuned else "") + (f" C{g.c}" if g.c != layer.problem.c else "")
                + (f" G{g.groups}" if g.groups != layer.problem.groups else ""))
        print(f"{layer.name:12s} {pass_.value:5s} {plan:33s} {k.registers:4d} {k.stack:5d} {k.total:6d} "
              f"{k.count('HMMA'):5d} {k.count('LDGSTS'):8d} {k.count('LDGSTS', '128'):5d} {k.count('LDG'):4d} "
              f"{k.count('STG'):4d} {k.count('STG', '128'):5d} {k.count('LDSM'):4d} {k.local:7d}")
    return 0
