"""Show that kernels whose text changed on purpose compile to the same SASS as before.

    python3 scripts/sass_compare.py OLD_COMMIT

Picks sm_90 tuning candidates covering every main-loop kind and pass (with its variants:
several tiles per block, stacked images, sliced K, split-K and its reduction kernel),
emits each with this tree and with OLD_COMMIT (exported by `git archive` to a temporary
folder, run in a subprocess), compiles both with NVRTC (no GPU needed) and disassembles
them with cuobjdump.  A case passes when the SASS text is identical once each kernel's
name is replaced by a placeholder, and registers and stack (``-res-usage``) match.  It
also says whether the sources differ only in the kernel names.  Exit status 1 if any
case differs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Run in either tree (a subprocess with that tree first on sys.path): emit the cases.
_EMIT = r"""
import json, sys
from convgen.emit import emit
from convgen.ir import Epilogue, KernelSpec, Pass, Plan, Target
from convgen.suites import SUITES
cases = json.loads(sys.stdin.read())
out = {}
for name, (suite, layer, pass_, plan_d, epi) in cases.items():
    prob = next(l.problem for l in SUITES[suite] if l.name == layer)
    p = Pass(pass_)
    plan = Plan.from_dict(plan_d, prob, p) if hasattr(Plan, "from_dict") else Plan(**plan_d)
    ks = emit(KernelSpec(prob, p, Epilogue(**epi), "float16", Target("sm_90"), plan))
    out[name] = {"source": ks.source, "arch": ks.compile_arch, "kernels": list(ks.kernel_names)}
print(json.dumps(out))
"""


def pick_cases() -> dict[str, list]:
    """The first candidate of each (kind, pass, variant) over every suite, for sm_90."""
    from convgen.ir import Pass, Target
    from convgen.footprint import halo_images
    from convgen.suites import SUITES

    try:
        from convgen.tools.tune import candidates  # type: ignore[import-not-found]
    except ImportError:
        from convgen.tune import candidates
    cases: dict[str, list] = {}
    for suite, layers in SUITES.items():
        for layer in layers:
            for pass_ in Pass:
                for c in candidates(layer.problem, pass_, Target("sm_90"), wgmma=True):
                    variant = [("tiles", c.tiles > 1), ("stacked", halo_images(c, layer.problem.geometry, pass_) > 1),
                               ("sliced", c.warps_k > 1), ("split", c.split_k > 1 and not c.halo)]
                    name = "-".join([type(c.loop).__name__, pass_.value] + [v for v, on in variant if on])
                    if name not in cases:
                        epi = {"bias": pass_ is not Pass.DGRAD, "relu": pass_ is Pass.FPROP}
                        cases[name] = [suite, layer.name, pass_.value, c.as_dict(), epi]
    return dict(sorted(cases.items()))


def emit_in(tree: Path, cases: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", _EMIT], input=json.dumps(cases), capture_output=True, text=True,
                          env=env, cwd=tree, check=True)
    return json.loads(done.stdout)


def _sass(source: str, arch: str, kernels: list[str]) -> tuple[str, dict]:
    from convgen.compile import cached_binary
    try:
        from convgen.tools.sass import find_cuobjdump, read_cubin
    except ImportError:  # before the tools moved apart
        from convgen.sass import find_cuobjdump, read_cubin

    cuobjdump = find_cuobjdump()
    assert cuobjdump, "no cuobjdump (install the dev extra)"
    binary = cached_binary(source, arch=arch)
    env = {**os.environ, "PATH": str(Path(cuobjdump).parent) + os.pathsep + os.environ.get("PATH", "")}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(binary)
        text = subprocess.run([cuobjdump, "-sass", str(path)], capture_output=True, text=True, env=env,
                              check=True).stdout
    res = {k: (v.registers, v.stack) for k, v in read_cubin(binary, cuobjdump).items()}
    for i, k in sorted(enumerate(kernels), key=lambda t: -len(t[1])):  # a reduce name extends its main's
        text = text.replace(k, f"KERNEL{i}")
        res[f"KERNEL{i}"] = res.pop(k)
    return text, res


def _compare(args: tuple[str, dict, dict]) -> tuple[str, bool, bool, int]:
    name, old, new = args
    renamed = old["source"]
    for o, n in sorted(zip(old["kernels"], new["kernels"]), key=lambda t: -len(t[0])):
        renamed = renamed.replace(o, n)
    a, b = _sass(old["source"], old["arch"], old["kernels"]), _sass(new["source"], new["arch"], new["kernels"])
    return name, renamed == new["source"], a == b, len(b[0].splitlines())


def main(old_commit: str) -> int:
    sys.path.insert(0, str(ROOT))
    cases = pick_cases()
    with tempfile.TemporaryDirectory(prefix="convgen-old-") as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", old_commit], capture_output=True, check=True).stdout
        with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
            tar.extractall(tmp)
        old = emit_in(Path(tmp), cases)
    new = emit_in(ROOT, cases)
    with ProcessPoolExecutor(2) as pool:  # NVRTC and cuobjdump use one CPU each
        rows = list(pool.map(_compare, [(k, old[k], new[k]) for k in cases]))
    bad = 0
    for (name, names_only, same, lines), k in zip(rows, cases):
        print(f"{name:28s} {new[k]['arch']:6s} {'SASS identical' if same else 'SASS DIFFERS':14s} "
              f"({lines} lines)  source {'differs only in kernel names' if names_only else 'changed beyond names'}  "
              f"{new[k]['kernels'][0]}")
        bad += not same
    print(f"{len(rows) - bad} of {len(rows)} kernels' SASS identical to {old_commit}'s")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
