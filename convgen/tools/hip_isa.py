"""What clang makes of a HIP kernel, read without an AMD GPU: the AMD sibling of tools/sass.py.

A kernel is compiled device-only to assembly (``-S``) with clang and the HIP and rocWMMA headers
the environment names (``scripts/hip_check.sh`` sets them up), and its code-object metadata is
read back: VGPRs, spills, scratch, and the matrix instructions in its body.
``tests/test_hip_compile.py`` (every suite kernel) and ``scripts/compile_fuzz.py`` (random
layers) both compile through here, so the two checks mean the same thing.

    CONVGEN_HIP_PATH          HIP install, the folder holding include/hip/hip_runtime.h (6.4.x)
    CONVGEN_ROCWMMA_INCLUDE   rocWMMA's library/include (holding rocwmma/rocwmma.hpp)
    CONVGEN_HIP_CLANG         clang++ with the AMDGPU target (clang 19)
    CONVGEN_HIP_OCKL_SHIM     optional: a header defining the ROCm device-library functions
                              behind threadIdx & co., so the ISA has no calls (realistic VGPRs)
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .. import config
from ..resources import include_dir


def toolchain(default_shim: str = "") -> tuple[dict[str, str] | None, str]:
    """The clang, HIP, rocWMMA and shim paths the environment names, or None and what is missing."""
    hip = config.HIP_PATH.get() or ""
    rocwmma = config.ROCWMMA_INCLUDE.get() or ""
    clang = config.HIP_CLANG.get() or ""
    problems = []
    if not hip or not (Path(hip) / "include" / "hip" / "hip_runtime.h").is_file():
        problems.append(f"CONVGEN_HIP_PATH={hip or '(unset)'} has no include/hip/hip_runtime.h")
    if not rocwmma or not (Path(rocwmma) / "rocwmma" / "rocwmma.hpp").is_file():
        problems.append(f"CONVGEN_ROCWMMA_INCLUDE={rocwmma or '(unset)'} has no rocwmma/rocwmma.hpp")
    clang_exe = shutil.which(clang) if clang else None
    if not clang_exe:
        problems.append(f"CONVGEN_HIP_CLANG={clang or '(unset)'} is not an executable")
    if problems:
        return None, "; ".join(problems)
    shim = config.HIP_OCKL_SHIM.get() or default_shim
    return {
        "hip": str(Path(hip)),
        "rocwmma": str(Path(rocwmma)),
        "clang": clang_exe,
        "shim": shim if shim and Path(shim).is_file() else "",
    }, ""


def compile_command(tools: dict[str, str], arch: str, src: Path, out: Path) -> list[str]:
    """The device-only compile of ``src`` to ISA in ``out`` (what scripts/hip_check.sh runs)."""
    cmd = [
        tools["clang"], "-x", "hip", f"--offload-arch={arch}", "--cuda-device-only", "-nogpulib",
        f"--hip-path={tools['hip']}", "-isystem", tools["rocwmma"], "-isystem", f"{tools['hip']}/include",
        f"-I{include_dir()}",  # convgen/device.h, the kernels' fixed helpers
        "-std=c++17", "-O3",
    ]
    if tools["shim"]:
        cmd += ["-include", tools["shim"]]
    return cmd + ["-S", "-o", str(out), str(src)]


def compile_to_isa(tools: dict[str, str], arch: str, source: str, names: tuple[str, ...], folder: Path,
                   stem: str = "kernel") -> tuple[subprocess.CompletedProcess, Path, dict[str, "KernelInfo"]]:
    """Writes ``source`` to folder/stem.hip, compiles it to folder/stem.s, and reads the named
    kernels back (none where the compile failed): the compiler's result, the ISA's path, the kernels."""
    hip_file, asm_file = folder / f"{stem}.hip", folder / f"{stem}.s"
    hip_file.write_text(source)
    proc = subprocess.run(compile_command(tools, arch, hip_file, asm_file), capture_output=True, text=True)
    ok = proc.returncode == 0 and asm_file.is_file()
    return proc, asm_file, parse_asm(asm_file.read_text(), names, arch) if ok else {}


@dataclass
class KernelInfo:
    name: str
    present: bool = False
    mma: int = 0  # v_wmma_* / v_mfma_* instructions in the kernel's body
    occupancy: int = 0  # waves per SIMD, from the compiler's "; Occupancy:" comment
    meta: dict[str, str] = field(default_factory=dict)  # the code-object metadata fields

    @property
    def uses_scratch(self) -> bool:
        return self.num("private_segment_fixed_size") != 0 or self.num("vgpr_spill_count") != 0

    def num(self, key: str) -> int:
        try:
            return int(self.meta.get(key, "0"))
        except ValueError:
            return -1


def mma_pattern(arch: str) -> re.Pattern[str]:
    return re.compile(r"^\s+v_mfma_" if arch.startswith("gfx9") else r"^\s+v_wmma_", re.M)


_FIELD = re.compile(r"^    \.(\w+):\s+(.*?)\s*$")


def parse_asm(asm: str, names: tuple[str, ...], arch: str) -> dict[str, KernelInfo]:
    """Each named kernel's presence, MMA count, occupancy and metadata in clang's assembly."""
    infos = {n: KernelInfo(n) for n in names}
    mma = mma_pattern(arch)
    for n, info in infos.items():
        globl = re.search(rf"^\s*\.globl\s+{re.escape(n)}\s*$", asm, re.M)
        label = re.search(rf"^{re.escape(n)}:", asm, re.M)
        info.present = bool(globl and label)
        if label:
            end = asm.find(".Lfunc_end", label.end())
            body = asm[label.end(): end if end >= 0 else len(asm)]
            info.mma = len(mma.findall(body))
            nxt = re.compile(r"^\s*\.globl\s|^\s*\.amdgpu_metadata", re.M).search(asm, label.end())
            occ = re.search(r"^; Occupancy: (\d+)", asm[label.end(): nxt.start() if nxt else len(asm)], re.M)
            info.occupancy = int(occ.group(1)) if occ else 0
    # amdhsa.kernels: one "  - " entry per kernel; its own fields sit at four spaces
    # (the argument list's fields are indented deeper).
    meta = asm[asm.find("amdhsa.kernels:"):]
    current: dict[str, str] = {}
    entries = [current]
    for line in meta.splitlines()[1:]:
        if line.startswith("  - "):
            current = {}
            entries.append(current)
            line = "    " + line[4:]
        elif line and not line.startswith(" "):
            break  # amdhsa.target etc.: the kernel list is over
        m = _FIELD.match(line)
        if m:
            current[m.group(1)] = m.group(2)
    for entry in entries:
        if entry.get("name") in infos:
            infos[entry["name"]].meta = entry
    return infos
