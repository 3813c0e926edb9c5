"""Show that a change to the kernels' text leaves their machine code alone.

    python3 scripts/sass_compare.py --ref <git ref> [--count 48] [--jobs 2]

A sample of sm_90 tuning candidates covering every main-loop kind, MMA flavour, pass and
epilogue path (sliced K, stacked images, several tiles per block, split-K, bias, ReLU, fp32
out) is emitted twice: by the tree at --ref (checked out with `git worktree` into a
temporary folder and run there in its own process) and by this tree.  Both sources are
compiled with NVRTC (sm_90, sm_90a for wgmma) and disassembled with `cuobjdump -sass`; each
kernel's instruction text (addresses and encodings dropped) and its register and stack use
must be identical.  Needs NVRTC and cuobjdump (the dev extra), no GPU.  Exit status 1 when
any kernel differs; the first differences are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Run in the --ref tree's own process (its convgen on sys.path): emit the listed specs.
_EMIT_AT_REF = r"""
import json, sys
sys.path.insert(0, ".")
from convgen.emit import emit
from convgen.ir import Epilogue, KernelSpec, Pass, Target
from convgen.suites import SUITES
try:
    from convgen.tools.tune import candidates
except ImportError:
    from convgen.tune import candidates
out = []
for suite, layer_name, pass_, i, epi in json.load(open(sys.argv[1])):
    layer = next(l for l in SUITES[suite] if l.name == layer_name)
    p = Pass(pass_)
    plan = candidates(layer.problem, p, Target("sm_90"), wgmma=True)[i]
    ks = emit(KernelSpec(layer.problem, p, Epilogue(**epi), "float16", Target("sm_90"), plan))
    out.append({"plan": plan.as_dict(), "source": ks.source, "arch": ks.compile_arch})
json.dump(out, open(sys.argv[2], "w"))
"""

EPILOGUES = {
    "fprop": ({}, {"bias": True, "relu": True}, {"out_dtype": "float32"}),
    "dgrad": ({},),
    "wgrad": ({}, {"bias": True}),
}


def _candidates():
    try:
        from convgen.tools.tune import candidates  # after the tools moved apart
    except ImportError:
        from convgen.tune import candidates
    return candidates


def sample(count: int) -> tuple[list[tuple[str, str, str, int, dict]], set[tuple]]:
    """(suite, layer, pass, candidate index, epilogue) covering every kind x pass x variant
    seen among the suites' sm_90 candidates, then more of the commonest until `count`."""
    from convgen.backends import backend_for
    from convgen.emit import _context
    from convgen.ir import Epilogue, KernelSpec, Pass, Target
    from convgen.suites import SUITES

    candidates = _candidates()
    target = Target("sm_90")
    be = backend_for(target)
    groups: dict[tuple, list] = {}
    for suite, layers in SUITES.items():
        for layer in layers:
            for pass_ in Pass:
                for i, plan in enumerate(candidates(layer.problem, pass_, target, wgmma=True)):
                    for epi in EPILOGUES[pass_.value]:
                        spec = KernelSpec(layer.problem, pass_, Epilogue(**epi), "float16", target, plan)
                        ctx = _context(spec, be)
                        variant = (pass_.value, ctx.kind, ctx.mma, plan.warps_k > 1, plan.tiles > 1,
                                   bool(ctx.halo and ctx.halo.imgs > 1), plan.split_k > 1, tuple(sorted(epi.items())),
                                   ctx.gathers.rowmap_a or ctx.gathers.rowmap_b, min(plan.vec_a, plan.vec_b) < 8)
                        groups.setdefault(variant, []).append((suite, layer.name, pass_.value, i, epi))
    picked = [members[0] for members in groups.values()]
    depth = 1
    while len(picked) < count and any(len(m) > depth for m in groups.values()):
        for members in sorted(groups.values(), key=len, reverse=True):
            if len(members) > depth and len(picked) < count:
                picked.append(members[len(members) * depth // (depth + 1) if depth else 0])
        depth += 1
    return picked, set(groups)


def emit_now(specs: list) -> list[dict]:
    from convgen.emit import emit
    from convgen.ir import Epilogue, KernelSpec, Pass, Target
    from convgen.suites import SUITES

    candidates = _candidates()
    out = []
    for suite, layer_name, pass_, i, epi in specs:
        layer = next(l for l in SUITES[suite] if l.name == layer_name)
        p = Pass(pass_)
        plan = candidates(layer.problem, p, Target("sm_90"), wgmma=True)[i]
        ks = emit(KernelSpec(layer.problem, p, Epilogue(**epi), "float16", Target("sm_90"), plan))
        out.append({"plan": plan.as_dict(), "source": ks.source, "arch": ks.compile_arch})
    return out


def emit_at_ref(ref: str, specs: list) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="convgen-sass-compare-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), ref], check=True)
        try:
            (Path(tmp) / "specs.json").write_text(json.dumps(specs))
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            subprocess.run([sys.executable, "-c", _EMIT_AT_REF, str(Path(tmp) / "specs.json"), str(Path(tmp) / "out.json")],
                           cwd=tree, check=True, env=env)
            return json.loads((Path(tmp) / "out.json").read_text())
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)


_INSTR = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;?\s*(?:/\*.*)?$")


def sass_text(source: str, arch: str) -> dict[str, tuple[str, list[str]]]:
    """Per kernel: its `REG:n STACK:n` line and its instructions, as cuobjdump prints them
    less the address and encoding comments."""
    from convgen.compile import compile_binary
    try:
        from convgen.tools.sass import find_cuobjdump
    except ImportError:
        from convgen.sass import find_cuobjdump

    cuobjdump = find_cuobjdump()
    binary = compile_binary(source, arch=arch)
    env = dict(os.environ, PATH=str(Path(cuobjdump).parent) + os.pathsep + os.environ.get("PATH", ""))
    with tempfile.TemporaryDirectory(prefix="convgen-sass-") as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(binary)
        sass = subprocess.run([cuobjdump, "-sass", str(path)], capture_output=True, text=True, env=env, check=True).stdout
        res = subprocess.run([cuobjdump, "-res-usage", str(path)], capture_output=True, text=True, env=env, check=True).stdout
    usage = dict(re.findall(r"Function (\S+):\s*\n\s*(REG:\d+ STACK:\d+)", res))
    kernels: dict[str, tuple[str, list[str]]] = {}
    name = None
    for line in sass.splitlines():
        m = re.match(r"^\s*Function : (\S+)\s*$", line)
        if m:
            name = m.group(1)
            kernels[name] = (usage.get(name, "?"), [])
            continue
        m = _INSTR.match(line)
        if m and name:
            kernels[name][1].append(m.group(1))
    return kernels


def _compare(pair: tuple[dict, dict]) -> tuple[int, int, list[str]]:
    old, new = pair
    a, b = sass_text(old["source"], old["arch"]), sass_text(new["source"], new["arch"])
    problems = []
    if sorted(a) != sorted(b):
        problems.append(f"kernels {sorted(a)} -> {sorted(b)}")
    for name in sorted(set(a) & set(b)):
        if a[name][0] != b[name][0]:
            problems.append(f"{name}: {a[name][0]} -> {b[name][0]}")
        if a[name][1] != b[name][1]:
            first = next((i for i, (x, y) in enumerate(zip(a[name][1], b[name][1])) if x != y),
                         min(len(a[name][1]), len(b[name][1])))
            problems.append(f"{name}: {len(a[name][1])} -> {len(b[name][1])} instructions, first difference at "
                            f"{first}: {a[name][1][first:first + 1]} -> {b[name][1][first:first + 1]}")
    return len(b), sum(len(v[1]) for v in b.values()), problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", required=True, help="the git ref whose emitted sources are the baseline")
    ap.add_argument("--count", type=int, default=48, help="kernels to compare (at least one per variant)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    specs, variants = sample(args.count)
    old, new = emit_at_ref(args.ref, specs), emit_now(specs)
    for s, o, n in zip(specs, old, new):
        if o["plan"] != n["plan"]:
            raise SystemExit(f"{s}: the ref's candidate is another plan ({o['plan']} vs {n['plan']}): pick a nearer ref")
    same_text = sum(o["source"] == n["source"] for o, n in zip(old, new))
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(_compare, zip(old, new)))
    kernels = sum(r[0] for r in results)
    instructions = sum(r[1] for r in results)
    bad = [(s, r[2]) for s, r in zip(specs, results) if r[2]]
    covered = sorted({f"{v[0]}/{v[1]}/{v[2]}" for v in variants})
    print(f"{len(specs)} specs ({len(specs) - same_text} with changed source text), {kernels} kernels, "
          f"{instructions} SASS instructions compared against {args.ref}: "
          f"{len(specs) - len(bad)} identical, {len(bad)} differ")
    print(f"{len(variants)} variants covered (pass/kind/mma: {', '.join(covered)})")
    for s, problems in bad[:10]:
        print("DIFFERS:", s)
        for p in problems[:5]:
            print("   ", p)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
