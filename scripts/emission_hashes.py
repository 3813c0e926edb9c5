"""Hash the source of every candidate plan of every built-in suite, for a refactor's gate.

A change that must not change behaviour must leave this list byte-identical:

    python3 scripts/emission_hashes.py > /tmp/after.txt
    diff scripts/emission_hashes.txt /tmp/after.txt

Each line is `arch pass suite/layer plan-key sha256(source + launch description)`.  The
candidates are the tuner's (`--wgmma` ones included) for sm_90 and gfx942, so every
main-loop kind, gather, MMA flavour and epilogue path is covered.  A change that alters a
kernel's text on purpose regenerates the list in the same commit, and says in its message
how the SASS was shown to be unchanged.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from convgen.emit import emit  # noqa: E402
from convgen.ir import Epilogue, Pass, Target
from convgen.spec import KernelSpec  # noqa: E402
from convgen.suites import SUITES  # noqa: E402


def _candidates(problem, pass_, target):
    try:
        from convgen.tools.tune import candidates  # after the tools moved apart
    except ImportError:
        from convgen.tune import candidates
    return candidates(problem, pass_, target, wgmma=True)


EPILOGUES = {
    Pass.FPROP: (Epilogue(), Epilogue(bias=True, relu=True), Epilogue(out_dtype="float32")),
    Pass.DGRAD: (Epilogue(),),
    Pass.WGRAD: (Epilogue(), Epilogue(bias=True)),
}


def lines():
    for arch in ("sm_90", "gfx942"):
        target = Target(arch)
        for suite, layers in SUITES.items():
            for layer in layers:
                for pass_ in Pass:
                    for i, plan in enumerate(_candidates(layer.problem, pass_, target)):
                        # the default plan gets every epilogue, the others the plain one
                        for j, epi in enumerate(EPILOGUES[pass_] if i == 0 else EPILOGUES[pass_][:1]):
                            ks = emit(KernelSpec(layer.problem, pass_, epi, "float16", target, plan))
                            launch = json.dumps(ks.manifest_entry()["kernels"], sort_keys=True)
                            digest = hashlib.sha256((ks.source + "\0" + launch).encode()).hexdigest()[:20]
                            yield f"{arch} {pass_.value} {suite}/{layer.name} c{i}e{j} {digest}"
    yield from bf16_lines()


def bf16_lines():
    """bfloat16 kernels (in and out), the planner's plan of each suite layer and pass: after
    every float16 line, so adding them changed no earlier line."""
    from convgen.planner import make_spec

    for arch in ("sm_90", "gfx942"):
        for suite, layers in SUITES.items():
            for layer in layers:
                for pass_ in Pass:
                    epi = Epilogue(bias=pass_ is not Pass.DGRAD, relu=pass_ is Pass.FPROP, out_dtype="bfloat16")
                    ks = emit(make_spec(layer.problem, pass_, target=Target(arch), epilogue=epi, in_dtype="bfloat16"))
                    launch = json.dumps(ks.manifest_entry()["kernels"], sort_keys=True)
                    digest = hashlib.sha256((ks.source + "\0" + launch).encode()).hexdigest()[:20]
                    yield f"{arch} {pass_.value} {suite}/{layer.name} bf16 {digest}"


if __name__ == "__main__":
    for line in lines():
        print(line)
