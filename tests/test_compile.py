"""convgen.compile: NVRTC on a machine with no GPU (the headers it finds, the errors and warnings
it raises, the emitted kernels' builds), and the no-GPU error paths.  The disk cache is
tests/test_compile_cache.py's, loading on a GPU tests/test_compile_gpu.py's.

Every test points CONVGEN_CACHE_DIR at its own tmp_path, so the user's real
cache is never read or written (the fixture below, which those files import).
"""

from __future__ import annotations

import os

import pytest

import convgen.compile as cc
import convgen.cuda_headers as ch
import convgen.kernel_store as ks
from convgen import resources

WMMA_SRC = r"""
#include <mma.h>
#include <cuda_fp16.h>
using namespace nvcuda;

// One warp: C[16x16] = A[16x16] (row-major) * B[16x16] (col-major), fp16 in, fp32 out.
extern "C" __global__ void wmma16(const half* a, const half* b, float* c) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::fill_fragment(fc, 0.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}
"""

SMEM_SRC = r"""
// Copies x -> y through dynamic shared memory sized by the launch.
extern "C" __global__ void through_smem(const float* x, float* y, int n) {
    extern __shared__ float buf[];
    int i = threadIdx.x;
    for (int j = i; j < n; j += blockDim.x) buf[j] = x[j] + 1.0f;
    __syncthreads();
    for (int j = i; j < n; j += blockDim.x) y[j] = buf[n - 1 - j];
}
"""

ELF = b"\x7fELF"

# NVRTC warns of a constant past int's range, as it did for an emitted `constexpr int H =
# 2147483648` before convgen/limits.py refused such shapes.
WARNING_SRC = r"""
extern "C" __global__ void wraps(int* y) { const int big = 2147483648; y[threadIdx.x] = big; }
"""


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Own cache dir, fresh in-process state, and the one-warning flag reset."""
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(ks, "_warned_unwritable", False)
    monkeypatch.setattr(ks, "_unwritable", set())
    cc.clear_memory_cache()
    yield
    cc.clear_memory_cache()


@pytest.fixture
def count_compiles(monkeypatch):
    """Counts real NVRTC runs (calls of compile_binary through the caches)."""
    calls: list[str] = []
    real = cc.compile_binary

    def counting(source, **kw):
        calls.append(kw["arch"])
        return real(source, **kw)

    monkeypatch.setattr(cc, "compile_binary", counting)
    return calls


# --------------------------------------------------------------------------- NVRTC, no GPU


def test_import_does_not_import_cupy():
    import subprocess
    import sys

    code = "import sys, convgen.compile; assert 'cupy' not in sys.modules, 'cupy imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_wmma_compiles_to_cubin_without_gpu(arch):
    binary = cc.compile_binary(WMMA_SRC, arch=arch)
    assert binary[:4] == ELF  # a cubin (ELF), not PTX text
    assert b"wmma16" in binary


def test_an_emitted_folder_compiles_with_only_its_own_include(tmp_path):
    """`convgen emit -o DIR` writes convgen/device.h next to the kernels: with -I DIR (and the
    CUDA headers), and not the package's include folder, every kernel of a suite compiles, so a
    dumped folder is self-contained for nvcc -I DIR.  Without it, the include is not found."""
    from convgen.cli import main

    out = tmp_path / "emitted"
    assert main(["emit", "--suite", "cifar-resnet", "--pass", "fprop", "-q", "-o", str(out)]) == 0
    import json

    arch = {e["file"]: e["compile_arch"] for e in json.loads((out / "manifest.json").read_text())["kernels"]}
    incs = [f"-I{d}" for d in cc.cuda_include_dirs()]
    kernels = sorted(out.glob("*.cu"))
    assert kernels and "sm_90a" in arch.values()  # TMA kernels among them, which include convgen/hopper.h
    for path in kernels:
        flags = cc._fixed_flags(arch[path.name], False) + incs
        binary, log = cc._nvrtc_compile(path.read_text(), path.name, flags + [f"-I{out}"])
        assert binary and binary[:4] == ELF, log
    binary, log = cc._nvrtc_compile(kernels[0].read_text(), kernels[0].name, cc._fixed_flags("sm_90", False) + incs)
    assert binary is None and "convgen/device.h" in log


def test_key_covers_the_device_header(monkeypatch, tmp_path):
    """The kernels include convgen/device.h, so its bytes are part of every cache key (through
    resources.templates_hash): an edited header must never reuse a binary built from the old."""
    import shutil

    copy = tmp_path / "templates"
    shutil.copytree(resources.templates_dir(), copy)
    monkeypatch.setattr(resources, "templates_dir", lambda: copy)
    before = cc.cache_key(WMMA_SRC, arch="sm_90")
    header = copy / "include" / "convgen" / "device.h"
    header.write_text(header.read_text() + "\n// edited\n")
    assert cc.cache_key(WMMA_SRC, arch="sm_90") != before


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cubin_is_a_whole_elf_file(arch):
    """CuPy's getCUBIN drops the binary's last byte; compile_binary must return every byte the
    ELF header accounts for (cuobjdump and nvdisasm refuse a file one byte short)."""
    binary = cc.compile_binary(WMMA_SRC, arch=arch)
    assert cc._elf_extent(binary) == len(binary)


def test_whole_elf_restores_exactly_one_missing_byte():
    binary = cc.compile_binary(WMMA_SRC, arch="sm_90")
    assert cc._whole_elf(binary) == binary  # already whole: unchanged
    assert cc._whole_elf(binary[:-1]) == binary  # one byte short: the zero byte is back
    assert cc._whole_elf(binary[:-2]) == binary[:-2]  # anything else is not ours to guess
    assert cc._whole_elf(b"not an elf") == b"not an elf"


def test_headers_are_of_nvrtcs_cuda_major():
    """NVRTC compiles with headers of its own CUDA major (mixing majors changes or breaks the
    kernels), whichever toolkits and wheels the machine has."""
    major, _ = cc.nvrtc_version()
    assert ch._header_major(cc.cuda_include_dirs()) in (None, major)


def test_include_dirs_have_mma():
    dirs = cc.cuda_include_dirs()
    assert dirs and all(os.path.isdir(d) for d in dirs)
    assert any(os.path.isfile(os.path.join(d, "crt", "mma.h")) for d in dirs)


def test_ptx_arch_rejected():
    with pytest.raises(ValueError, match="sm_90"):
        cc.compile_binary(WMMA_SRC, arch="compute_90")


def test_syntax_error_raises_with_log_and_source(tmp_path):
    bad = WMMA_SRC.replace("wmma::fill_fragment(fc, 0.0f);", "wmma::fill_fragment(fc, 0.0f)\n  oops;")
    with pytest.raises(cc.CompileError) as info:
        cc.compile_binary(bad, arch="sm_90", name="bad.cu")
    err = info.value
    assert "error" in err.log and "oops" in err.log
    assert err.source_path is not None and err.source_path.exists()
    assert err.source_path.read_text() == bad
    assert err.source_path.is_relative_to(tmp_path / "cache" / "failed")
    assert "--gpu-architecture=sm_90" in err.options
    assert "oops" in str(err)


def test_missing_headers_name_the_fix(monkeypatch, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("CONVGEN_CUDA_INCLUDE", str(empty))
    with pytest.raises(cc.HeaderNotFoundError) as info:
        cc.compile_binary(WMMA_SRC, arch="sm_90")
    msg = str(info.value)
    assert "crt/mma.h" in msg and "CONVGEN_CUDA_INCLUDE" in msg
    assert "convgen[cuda13]" in msg and "CUDA_HOME" in msg
    assert isinstance(info.value, cc.CompileError)


def test_no_header_source_anywhere(monkeypatch, tmp_path):
    monkeypatch.delenv("CONVGEN_CUDA_INCLUDE", raising=False)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nope"))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    real_has = ch._has_mma
    monkeypatch.setattr(ch, "_has_mma", lambda p: False if "/usr/local/cuda" in str(p) else real_has(p))
    monkeypatch.setattr(ch, "_wheel_groups", lambda: [])
    with pytest.raises(cc.HeaderNotFoundError, match=r"nvidia-cuda-crt.*CUDA_PATH"):
        cc.cuda_include_dirs()


def test_include_lookup_order(monkeypatch, tmp_path):
    def fake_toolkit(name):
        inc = tmp_path / name / "include" / "crt"
        inc.mkdir(parents=True)
        (inc / "mma.h").write_text("")
        return tmp_path / name

    home, path = fake_toolkit("home"), fake_toolkit("path")
    monkeypatch.delenv("CONVGEN_CUDA_INCLUDE", raising=False)
    monkeypatch.setenv("CUDA_HOME", str(home))
    monkeypatch.setenv("CUDA_PATH", str(path))
    assert cc.cuda_include_dirs() == [str(home / "include")]
    monkeypatch.delenv("CUDA_HOME")
    assert cc.cuda_include_dirs() == [str(path / "include")]
    monkeypatch.setenv("CONVGEN_CUDA_INCLUDE", os.pathsep.join([str(home / "include"), "/no/such"]))
    assert cc.cuda_include_dirs() == [str(home / "include")]  # only existing dirs


def test_include_lookup_prefers_nvrtcs_cuda_major(monkeypatch, tmp_path):
    """A toolkit of another CUDA major (say 12 in /usr/local/cuda beside NVRTC 13's wheels)
    does not shadow headers of NVRTC's own major; of two matching sources the first wins."""
    def headers(name, version):
        inc = tmp_path / name / "include"
        (inc / "crt").mkdir(parents=True)
        (inc / "crt" / "mma.h").write_text("")
        (inc / "cuda.h").write_text(f"#pragma once\n#define CUDA_VERSION {version}\n")
        return inc

    old, new, wheel = headers("cuda-12", 12080), headers("cuda-13", 13000), headers("wheel", 13050)
    monkeypatch.delenv("CONVGEN_CUDA_INCLUDE", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(cc, "nvrtc_version", lambda: (13, 5))
    monkeypatch.setattr(ch, "_wheel_groups", lambda: [[wheel]])
    real_has = ch._has_mma  # this machine's own /usr/local/cuda stays out of it
    monkeypatch.setattr(ch, "_has_mma", lambda p: False if "/usr/local/cuda" in str(p) else real_has(p))
    monkeypatch.setenv("CUDA_HOME", str(old.parent))
    assert cc.cuda_include_dirs() == [str(wheel)]
    monkeypatch.setenv("CUDA_PATH", str(new.parent))
    assert cc.cuda_include_dirs() == [str(new)]  # a matching toolkit keeps its place before the wheels
    monkeypatch.setattr(cc, "nvrtc_version", lambda: (12, 8))
    assert cc.cuda_include_dirs() == [str(old)]
    monkeypatch.setattr(cc, "nvrtc_version", lambda: (11, 8))  # no source matches: the first one
    assert cc.cuda_include_dirs() == [str(old)]


def test_header_major_reads_cuda_version():
    inc = cc.cuda_include_dirs()
    assert ch._header_major(inc) == cc.nvrtc_version()[0]  # this install's headers are NVRTC's major


def test_compiler_warning_is_an_error_under_werror(monkeypatch, tmp_path):
    monkeypatch.setenv("CONVGEN_WERROR", "1")
    with pytest.raises(cc.CompileError, match=r"NVRTC warned compiling w\.cu for sm_90: .*warning") as info:
        cc.compile_binary(WARNING_SRC, arch="sm_90", name="w.cu")
    assert "2147483648" in info.value.log and info.value.source_path.read_text() == WARNING_SRC
    monkeypatch.setenv("CONVGEN_WERROR", "0")
    with pytest.warns(cc.CompilerWarning, match="NVRTC warned compiling w.cu"):
        assert cc.compile_binary(WARNING_SRC, arch="sm_90", name="w.cu")[:4] == ELF


def test_emitted_kernels_compile_without_warnings(monkeypatch):
    """Every pass's kernel, with #177-D (an unused device-header helper) suppressed, gives an empty log."""
    from convgen.emit import emit
    from convgen.ir import ConvProblem
    from convgen.planner import make_spec

    for pass_ in ("fprop", "dgrad", "wgrad"):
        src = emit(make_spec(ConvProblem(12, 12, 16, 24, 3, 3, 1, 1, 1, n=2), pass_))
        from convgen.resources import include_dir

        opts = cc._fixed_flags("sm_90", False) + [f"-I{d}" for d in [include_dir(), *cc.cuda_include_dirs()]]
        binary, log = cc._nvrtc_compile(src.source, src.filename, opts)
        assert binary and log.strip() == "", log[:2000]


def _tma_register_cases():
    from convgen.tma_rules import PERSISTENT_TILES

    tiles = sorted({(p, t) for (p, _, _), t in PERSISTENT_TILES.items()})
    return [(p, bm, bn, st, pp, stride) for p, (bm, bn, st, pp) in tiles for stride in (1, 2)] + \
        [(p, 128, 128, 4, None, stride) for p in ("fprop", "dgrad") for stride in (1, 2)]  # one block a tile


@pytest.mark.parametrize("case", _tma_register_cases(), ids=lambda c: "-".join(map(str, c)))
def test_two_consumer_tma_kernels_keep_their_register_split(case):
    """ptxas ignores setmaxnreg (C7507, 'Potential Performance Loss') where code is reached by
    both the 40-register producer and the consumers, and the consumers then run on the
    launch's 168: every two-consumer TMA kernel, strided dgrad's class switch included,
    compiles with an empty log."""
    from convgen.emit import emit
    from convgen.ir import ConvProblem, Target
    from convgen.spec import Plan
    from convgen.mainloop import TmaWgmma
    from convgen.planner import make_spec
    from convgen.resources import include_dir

    pass_, bm, bn, stages, pingpong, stride = case
    loop = TmaWgmma() if pingpong is None else TmaWgmma(persistent=True, pingpong=pingpong)
    plan_ = Plan(bm, bn, 64, 8, 1, stages, 8, 8, loop=loop)
    src = emit(make_spec(ConvProblem(28, 28, 256, 256, 3, 3, stride, 1, 1, n=8), pass_, target=Target("sm_90"), plan_=plan_))
    opts = cc._fixed_flags(src.compile_arch, False) + [f"-I{d}" for d in [include_dir(), *cc.cuda_include_dirs()]]
    binary, log = cc._nvrtc_compile(src.source, src.filename, opts)
    assert binary and log.strip() == "", log[:2000]


@pytest.mark.parametrize("plan_", [
    None,  # the planner's
    "split", "halo", "halo-tiles", "staged-halo",
])
def test_a_float16_bias_compiles_in_every_fprop_loop_without_warnings(plan_):
    """fprop's epilogue reads a float16 bias as it is (convgen.torch's float16 models): the
    bias parameter, its add in the main kernel and in the split-K reduction compile cleanly
    in each non-TMA main-loop kind (tests/test_tma.py compiles the TMA one)."""
    from convgen.emit import emit
    from convgen.ir import ConvProblem, Epilogue
    from convgen.spec import Plan
    from convgen.mainloop import HaloTile, StagedHalo
    from convgen.planner import make_spec
    from convgen.resources import include_dir

    prob = ConvProblem(32, 32, 3, 32, 3, 3, 1, 1, 1, n=2) if plan_ == "staged-halo" else \
        ConvProblem(12, 12, 16, 24, 3, 3, 1, 1, 1, n=2)
    hand = {None: None, "split": Plan(64, 32, 16, 2, 2, 2, 8, 8, split_k=3),
            "halo": Plan(64, 32, 16, 2, 2, 2, 8, 8, loop=HaloTile(16)),
            "halo-tiles": Plan(64, 32, 16, 2, 2, 2, 8, 8, loop=HaloTile(16, 2)),
            "staged-halo": Plan(64, 32, 32, 4, 1, 2, 1, 1, loop=StagedHalo(16))}[plan_]
    src = emit(make_spec(prob, "fprop", epilogue=Epilogue(bias=True, relu=True, bias_dtype="float16"), plan_=hand))
    assert "const half_t* __restrict__ bias" in src.source
    assert (src.reduce is not None) == (plan_ == "split")
    opts = cc._fixed_flags("sm_90", False) + [f"-I{d}" for d in [include_dir(), *cc.cuda_include_dirs()]]
    binary, log = cc._nvrtc_compile(src.source, src.filename, opts)
    assert binary and log.strip() == "", log[:2000]


@pytest.mark.parametrize("plan_", [None, "split", "halo", "halo-tiles", "staged-halo", "tma", "tma-persistent",
                                   "tma-pingpong"])
@pytest.mark.parametrize("epi", [dict(bias=True, gelu=True, residual=True),
                                 dict(relu=True, residual=True, out_dtype="float32")], ids=["gelu-fp16", "relu-fp32"])
def test_a_residual_and_gelu_compile_in_every_fprop_loop_without_warnings(plan_, epi):
    """The residual epilogue (act(alpha * conv + bias + beta * residual)) and GELU: the
    residual's parameter in y's type and its two scales, read in the main kernel's drain and
    in the split-K reduction, compile cleanly in each fprop main-loop kind."""
    from convgen.emit import emit
    from convgen.ir import ConvProblem, Epilogue
    from convgen.spec import Plan
    from convgen.mainloop import HaloTile, StagedHalo, TmaWgmma
    from convgen.planner import make_spec
    from convgen.resources import include_dir

    c = {"staged-halo": 3, "halo-tiles": 16}.get(plan_, 64)  # (one-step reductions for two tiles a block)
    prob = ConvProblem(32 if c == 3 else 12, 32 if c == 3 else 12, c, 24, 3, 3, 1, 1, 1, n=2)
    hand = {None: None, "split": Plan(64, 32, 16, 2, 2, 2, 8, 8, split_k=3),
            "halo": Plan(64, 32, 16, 2, 2, 2, 8, 8, loop=HaloTile(16)),
            "halo-tiles": Plan(64, 32, 16, 2, 2, 2, 8, 8, loop=HaloTile(16, 2)),
            "staged-halo": Plan(64, 32, 32, 4, 1, 2, 1, 1, loop=StagedHalo(16)),
            "tma": Plan(64, 32, 64, 4, 1, 3, 8, 8, loop=TmaWgmma()),
            "tma-persistent": Plan(128, 32, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True)),
            "tma-pingpong": Plan(128, 32, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True))}[plan_]
    src = emit(make_spec(prob, "fprop", epilogue=Epilogue(**epi), plan_=hand))
    out_t = "float" if epi.get("out_dtype") == "float32" else "half_t"
    assert f"const {out_t}* __restrict__ residual, float alpha, float beta" in src.source
    assert ("gelu(" in src.source) == ("gelu" in epi)
    assert src.main.args[2 + ("bias" in epi):5 + ("bias" in epi)] == ("residual", "alpha", "beta")
    assert (src.reduce is not None) == (plan_ == "split")
    arch = "sm_90a" if plan_ and plan_.startswith("tma") else "sm_90"
    opts = cc._fixed_flags(arch, False) + [f"-I{d}" for d in [include_dir(), *cc.cuda_include_dirs()]]
    binary, log = cc._nvrtc_compile(src.source, src.filename, opts)
    assert binary and log.strip() == "", log[:2000]


def test_gpu_unavailable_reason_tells_no_device_from_an_old_driver(monkeypatch):
    cupy = pytest.importorskip("cupy")
    runtime = cupy.cuda.runtime

    class Failure(Exception):
        def __init__(self, status):
            super().__init__(f"status {status}")
            self.status = status

    def probe(status, driver):
        def fail():
            raise Failure(status)
        monkeypatch.setattr(runtime, "getDeviceCount", fail)
        monkeypatch.setattr(runtime, "driverGetVersion", lambda: driver)
        monkeypatch.setattr(runtime, "runtimeGetVersion", lambda: 13020)
        return cc.gpu_unavailable_reason()

    assert probe(35, 0).startswith("no CUDA device: no NVIDIA driver is installed")  # what CUDA says with no driver
    assert probe(35, 12080).startswith("driver too old: the NVIDIA driver supports CUDA 12.8, CuPy's runtime is CUDA 13.2")
    assert probe(100, 13000).startswith("no CUDA device: the NVIDIA driver (CUDA 13.0) sees no GPU")
    monkeypatch.setattr(runtime, "getDeviceCount", lambda: 0)
    assert cc.gpu_unavailable_reason() == "no CUDA device: the device count is 0"


def test_gpu_unavailable_reason_here():
    reason = cc.gpu_unavailable_reason()
    if reason is None:
        pytest.skip("a GPU is present")
    assert reason.startswith(("no CUDA device", "driver too old")), reason


# --------------------------------------------------------------------------- errors without a GPU


def test_detect_target_without_gpu_says_so():
    from conftest import gpu_unavailable_reason

    if gpu_unavailable_reason() is None:
        pytest.skip("a GPU is present")
    with pytest.raises(cc.DeviceError, match="no usable GPU"):
        cc.detect_target()
