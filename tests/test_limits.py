"""The kernels' 32-bit limits (convgen/limits.py): refused where a spec is made, with the value
and the limit; at the limit, the emitted kernel holds only int-sized constants and NVRTC
compiles it without a warning; no CLI command ends in a traceback on any shape."""

from __future__ import annotations

import contextlib
import io
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convgen import cli, limits
from convgen.emit import emit
from convgen.ir import ConvGeometry, ConvProblem, Pass, Target, Epilogue
from convgen.spec import KernelSpec, Plan
from convgen.planner import make_spec, plan

INT_MAX = 2**31 - 1
CONSTEXPR = re.compile(r"constexpr (?:int|long long) ([^;]*);")


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def shape_args(n=1, h=8, w=8, c=8, k=8, r=3, s=3, *extra: str) -> list[str]:
    return ["-n", str(n), "-h", str(h), "-w", str(w), "-c", str(c), "-k", str(k), "-r", str(r), "-s", str(s), *extra]


# --------------------------------------------------------------------------- refusals name the value and limit


@pytest.mark.parametrize("problem, pass_, message", [
    (ConvProblem(2**31, 8, 8, 8, 3, 3, n=1), "fprop", r"^h = 2147483648 exceeds 2147483647"),
    (ConvProblem(8, 8, 2**31, 8, 1, 1, n=1), "wgrad", r"^c = 2147483648 exceeds 2147483647"),
    (ConvProblem(8, 8, 8, 8, 3, 3, 2**31, n=1), "dgrad", r"^stride \(height\) = 2147483648 exceeds 2147483647"),
    (ConvProblem(2**30, 1, 8, 8, 1, 1, n=1), "fprop", r"^padded input height h \+ 2\*padding = 1073741824 exceeds 1073741823"),
    (ConvProblem(70000, 70000, 8, 8, 3, 3, 1, 1, n=1), "fprop",
     r"^pixels per padded image \(h \+ 2\*padding\) \* \(w \+ 2\*padding\) = 70002\*70002 = 4900280004 exceeds 2147483647"),
    (ConvProblem(46341, 46341, 8, 8, 1, 1, n=1), "dgrad", r"= 46341\*46341 = 2147488281 exceeds 2147483647"),
    (ConvProblem(9, 9, 2**29, 8, 3, 3, n=1), "fprop", r"^R\*S\*C \(a weight row\) = 4831838208 exceeds 2147483391"),
    (ConvProblem(9, 9, 8, 2**29, 3, 3, n=1), "dgrad", r"^R\*S\*K \(dgrad's reduction\) = 4831838208 exceeds"),
    (ConvProblem(8, 8, 8, 65536 * 128 + 1, 1, 1, n=1), "fprop",
     r"^output-column tiles ceil\(K / block_n\) = ceil\(8388609 / 128\) = 65537 exceeds 65535"),
    (ConvProblem(8, 8, 8, 8, 1, 1, n=2**31), "fprop", r"^batch size n = 2147483648 exceeds 2147483391"),
    (ConvProblem(1024, 1024, 8, 8, 1, 1, n=2**17), "wgrad",
     r"^wgrad's K-steps ceil\(N\*P\*Q / block_k\) = ceil\(137438953472 / 64\) = 2147483648 exceeds"),
])
def test_refused_with_value_and_limit(problem, pass_, message):
    with pytest.raises(limits.IndexLimitError, match=message):
        make_spec(problem, pass_)


def test_limits_are_value_errors():
    assert issubclass(limits.IndexLimitError, ValueError)  # the CLI's one-line error path catches ValueError


def test_dgrad_tap_step_and_classes():
    with pytest.raises(limits.IndexLimitError, match=r"lcm\(stride, dilation\) \(height, dgrad's tap step\) = 5368709095"):
        make_spec(ConvProblem(2**30 - 3, 1, 8, 8, 2, 1, (5, 1), 0, (2**30 - 5, 1), n=1), "dgrad")
    with pytest.raises(limits.IndexLimitError, match=r"residue classes SH\*SW = 17\*16 = 272 exceed 256"):
        make_spec(ConvProblem(64, 64, 8, 8, 3, 3, (17, 16), 1, n=1), "dgrad")
    make_spec(ConvProblem(64, 64, 8, 8, 16, 16, 16, 0, n=1), "dgrad")  # a 16x16 patchify stem's dgrad


def test_dgrad_weight_step_of_a_hand_plan():
    # dgrad's im2col gather offsets a K-step's weight rows by Map::row(i) * R*S*C in int.
    g = ConvProblem(4, 4, 8_000_000, 64, 3, 3, 1, 1, n=1)  # R*S*C = 72000000 fits; 32 * it does not
    p = Plan(128, 128, 32, 4, 2, 3, 8, 8)
    with pytest.raises(limits.IndexLimitError, match=r"block_k \* R\*S\*C \(dgrad's weight step\) = 2304000000"):
        limits.check_plan(g, Pass.DGRAD, p)


def test_launch_checks_the_batch_of_a_kernel_built_for_another():
    """The runtime reuses a kernel for every batch size; check_launch sees each batch."""
    spec = make_spec(ConvProblem(1024, 1024, 8, 8, 1, 1, n=4), "wgrad")
    src = emit(spec)
    limits.check_launch(src, 4)
    limits.check_launch(src, 2**16)
    with pytest.raises(limits.IndexLimitError, match="wgrad's K-steps"):
        limits.check_launch(src, 2**17)
    with pytest.raises(limits.IndexLimitError, match="batch size n = 2147483648"):
        limits.check_launch(emit(make_spec(ConvProblem(8, 8, 8, 8, 1, 1, n=1), "fprop")), 2**31)


def test_runtime_checks_a_new_batch_against_a_cached_kernel(monkeypatch):
    """convgen.runtime._kernel's cached path (a later call with another batch) runs check_launch."""
    from convgen import runtime

    problem = ConvProblem(1024, 1024, 8, 8, 1, 1, n=4)
    spec = make_spec(problem, "wgrad")
    epi, src = spec.epilogue, emit(spec)
    key = (problem.geometry, Pass.WGRAD, epi, "float16", 0, None, False)
    monkeypatch.setitem(runtime._cache, key, runtime._Kernel.build(src, None, None))
    assert runtime._kernel(problem.with_batch(8), Pass.WGRAD, epi, "float16", 0, None, False).source is src
    with pytest.raises(limits.IndexLimitError, match="wgrad's K-steps"):
        runtime._kernel(problem.with_batch(2**17), Pass.WGRAD, epi, "float16", 0, None, False)


# --------------------------------------------------------------------------- at the limit: int-sized, no warning


def constexpr_values(source: str) -> dict[str, int]:
    """Every integer literal a `constexpr int NAME = VALUE` of the emitted source gives."""
    out = {}
    for decl in CONSTEXPR.findall(source):
        for part in decl.split(","):
            name, _, value = part.partition("=")
            if re.fullmatch(r"\s*-?\d+\s*", value):
                out[name.strip()] = int(value)
    return out


# Shapes at a limit, and the passes a further limit still refuses (with what it names).
AT_THE_LIMIT = [
    pytest.param(ConvProblem(1, 2**30 - 1, 8, 8, 1, 1, n=1), {}, id="w=2^30-1"),
    pytest.param(ConvProblem(46340, 46340, 8, 16, 1, 1, n=1), {}, id="46340^2-pixels"),
    pytest.param(ConvProblem(46338, 46338, 8, 8, 3, 3, 1, 1, n=1), {}, id="46340^2-padded"),
    pytest.param(ConvProblem(4, 4, 2**27 - 32, 8, 4, 4, 1, 1, n=1),
                 {"dgrad": "output-column tiles", "wgrad": "output-column tiles"}, id="RSC-near-2^31"),
    pytest.param(ConvProblem(64, 64, 8, 8, 3, 3, 2**30 - 1, 1, 32, n=1), {"dgrad": "residue classes"},
                 id="huge-stride"),
]


@pytest.mark.parametrize("problem, refused", AT_THE_LIMIT)
@pytest.mark.parametrize("pass_", ["fprop", "dgrad", "wgrad"])
def test_at_the_limit_every_constant_is_an_int(problem, refused, pass_):
    if pass_ in refused:
        with pytest.raises(limits.IndexLimitError, match=re.escape(refused[pass_])):
            make_spec(problem, pass_)
        return
    values = constexpr_values(emit(make_spec(problem, pass_)).source)
    assert {"H", "W", "C", "K", "P", "Q"} <= set(values)
    assert all(-2**31 <= v <= INT_MAX for v in values.values()), values


@pytest.mark.parametrize("problem, refused", AT_THE_LIMIT[:3] + AT_THE_LIMIT[4:])
def test_at_the_limit_nvrtc_compiles_without_a_warning(problem, refused, monkeypatch):
    """NVRTC folds the constexpr products (P*Q, R*S*C, ...) and warns when one overflows int,
    as it did for H = 2^31; CONVGEN_WERROR=1 makes that warning an error."""
    cc = pytest.importorskip("convgen.compile")
    pytest.importorskip("cupy")
    monkeypatch.setenv("CONVGEN_WERROR", "1")
    for pass_ in sorted({"fprop", "dgrad", "wgrad"} - set(refused)):
        src = emit(make_spec(problem, pass_))
        assert cc.compile_binary(src.source, arch="sm_90", name=src.filename)[:4] == b"\x7fELF"


def test_past_the_limit_nvrtc_warns():
    """What the limits prevent: H = 2^31 emitted anyway (a KernelSpec made by hand, skipping
    make_spec) is an out-of-range int constant, which NVRTC warns about."""
    cc = pytest.importorskip("convgen.compile")
    pytest.importorskip("cupy")
    g = ConvGeometry(2**31, 8, 8, 8, 1, 1)
    spec = KernelSpec(g, Pass.FPROP, Epilogue(), "float16", Target(), plan(ConvProblem(2**31, 8, 8, 8, 1, 1), "fprop"))
    with pytest.raises(cc.CompileError, match="warn"):
        cc.compile_binary(emit(spec).source, arch="sm_90")


# --------------------------------------------------------------------------- any shape: a spec or a ValueError

big = st.one_of(st.integers(1, 64), st.integers(1, 2**34), st.sampled_from([2**30 - 1, 2**30, 2**31 - 1, 2**31, 46341]))


@settings(max_examples=150)
@given(h=big, w=big, c=big, k=big, r=st.integers(1, 7), s=st.integers(1, 7), stride=big, pad=st.integers(0, 3),
       dil=st.one_of(st.integers(1, 3), big), n=big, pass_=st.sampled_from(list(Pass)))
def test_any_shape_gives_an_int_sized_kernel_or_a_value_error(h, w, c, k, r, s, stride, pad, dil, n, pass_):
    try:
        problem = ConvProblem(h, w, c, k, r, s, stride, pad, dil, n=n)
        spec = make_spec(problem, pass_)
    except ValueError:
        return
    values = constexpr_values(emit(spec).source)
    assert all(-2**31 <= v <= INT_MAX for v in values.values()), values
    assert problem.n <= INT_MAX


@settings(max_examples=60)
@given(h=big, w=big, c=big, k=big, n=big, command=st.sampled_from(["emit", "plan", "sass"]))
def test_cli_never_ends_in_a_traceback(h, w, c, k, n, command, tmp_path_factory):
    """Any shape: exit 0, or one `convgen: error:` line and exit 2 (sass of an accepted shape
    would compile; only shapes the planner refuses are sent to it)."""
    argv = [command, *shape_args(n, h, w, c, k, 3, 3, "--padding", "1")]
    if command == "emit":
        argv += ["-o", str(tmp_path_factory.mktemp("emit")), "-q"]
    if command == "sass":
        try:
            for p in Pass:
                make_spec(ConvProblem(h, w, c, k, 3, 3, 1, 1, n=n), p)
            return  # accepted: `convgen sass` would compile it (covered by tests/test_sass.py)
        except ValueError:
            pass
    rc, _, err = run_cli(*argv)
    assert rc in (0, 2)
    if rc == 2:
        assert err.startswith("convgen: error: ") and err.count("\n") == 1, err


@pytest.mark.parametrize("command", ["emit", "plan", "sass"])
@pytest.mark.parametrize("shape, named", [
    (dict(h=2147483648), "h = 2147483648"),
    (dict(h=70000, w=70000), "pixels per padded image"),
    (dict(n=2147483648), "batch size n = 2147483648"),
])
def test_cli_huge_shapes_are_one_line_errors(command, shape, named, tmp_path):
    argv = [command, *shape_args(**shape)]
    if command == "emit":
        argv += ["-o", str(tmp_path / "out")]
    rc, _, err = run_cli(*argv)
    assert rc == 2 and err.startswith("convgen: error: ") and named in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_numpy_ints_are_checked_alike():
    with pytest.raises(limits.IndexLimitError, match="h = 2147483648"):
        make_spec(ConvProblem(np.int64(2**31), 8, 8, 8, 1, 1, n=1), "fprop")
