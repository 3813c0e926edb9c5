"""The TMA halo loop (TmaHalo) without a GPU: where the planner takes it, what the checker
refuses, its plan dict, its candidates, and its tiling simulated in NumPy from the facts the
emitter writes into the kernel (the kernel itself runs in tests/test_tma_halo_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest

from convgen import reference, tma_halo
from convgen.candidates import candidates
from convgen.emit import emit
from convgen.ir import ConvProblem, Epilogue, Pass, Target
from convgen.mainloop import TmaHalo, TmaWgmma
from convgen.planner import check_plan, make_spec, plan as default_plan
from convgen.spec import Plan
from convgen.suites import SUITES

SM90 = Target(arch="sm_90", sm_count=132)


def _layer(h: int, w: int, n: int = 2, **kw) -> ConvProblem:
    args = dict(c=64, k=64, r=3, s=3, stride=1, padding=1, dilation=1) | kw
    return ConvProblem.create(h=h, w=w, n=n, **args)


def test_the_suites_64_channel_3x3_layers_take_it_in_fprop_and_dgrad_and_wgrad_does_not():
    taken = set()
    for suite, layers in SUITES.items():
        for layer in layers:
            for pass_ in Pass:
                p = default_plan(layer.problem, pass_, SM90)
                if isinstance(p.loop, TmaHalo):
                    taken.add((f"{suite}/{layer.name}", pass_))
                    assert any("TMA halo loop" in r for r in p.reasons)
    names = {"resnet50/l1-3x3", "resnet18/l1-3x3", "vgg16/conv1_2", "unet/enc2b"}
    assert taken == {(n, p) for n in names for p in (Pass.FPROP, Pass.DGRAD)}


def test_the_pitch_is_the_one_with_fewest_tiles():
    # 128x128 (UNet): pitch 32 tiles it in 32 x 5 = 160 tiles, 64 in 64 x 3 = 192, 128 in 128 x 2
    assert default_plan(_layer(128, 128), Pass.FPROP, SM90).loop == TmaHalo(32)
    # 4x62: pitch 64's 62 columns cover a row (2 tiles of 2 rows), pitch 32 needs 3 across, 128 4 down
    assert default_plan(_layer(4, 62), Pass.FPROP, SM90).loop == TmaHalo(64)
    # 100 wide, one row: pitch 128 covers it in one tile, 64 in 2, 32 in 4
    assert default_plan(_layer(1, 100), Pass.FPROP, SM90).loop == TmaHalo(128)


def test_small_images_keep_the_im2col_loop_and_say_why():
    p = default_plan(_layer(8, 8, n=256), Pass.FPROP, SM90)  # CIFAR's res3: 75% of a tile's positions padding
    assert isinstance(p.loop, TmaWgmma)
    assert any(r.startswith("not the TMA halo loop: 75% of its best tile's positions") for r in p.reasons)


@pytest.mark.parametrize("problem, pass_, target, in_dtype, words", [
    (_layer(56, 56, c=128), Pass.FPROP, SM90, "float16", "reduces 64 channels"),
    (_layer(56, 56, k=32), Pass.DGRAD, SM90, "float16", "K=32, C=64"),
    (_layer(56, 56, k=96), Pass.FPROP, SM90, "float16", "C=64, K=96"),
    (_layer(56, 56, c=96), Pass.DGRAD, SM90, "float16", "K=64, C=96"),
    (_layer(56, 56, stride=2), Pass.FPROP, SM90, "float16", "stride 1"),
    (_layer(56, 56, dilation=2, padding=2), Pass.FPROP, SM90, "float16", "dilation 1"),
    (_layer(56, 56, r=1, s=1, padding=0), Pass.FPROP, SM90, "float16", "3x3 filters"),
    (_layer(56, 56, groups=2), Pass.FPROP, SM90, "float16", "groups=2"),
    (_layer(56, 56), Pass.WGRAD, SM90, "float16", "computes fprop and dgrad"),
    (_layer(56, 56), Pass.FPROP, SM90, "float32", "16-bit inputs"),
    (_layer(56, 56), Pass.FPROP, Target(arch="sm_80", sm_count=108), "float16", "sm_90a"),
])
def test_the_checker_refuses_it_where_it_cannot_run(problem, pass_, target, in_dtype, words):
    with pytest.raises(ValueError, match="TmaHalo: the TMA halo loop") as err:
        check_plan(tma_halo.make(64, 2, "float16"), problem, pass_, target, in_dtype)
    assert words in str(err.value)
    assert not isinstance(default_plan(problem, pass_, target, in_dtype).loop, TmaHalo)


@pytest.mark.parametrize("pass_, problem", [(Pass.FPROP, _layer(56, 56, k=128)), (Pass.DGRAD, _layer(56, 56, c=192))])
def test_wider_outputs_run_as_slices_offered_last_and_never_by_default(pass_, problem):
    check_plan(tma_halo.make(32), problem, pass_, SM90, "float16")  # the kind can run them
    default = default_plan(problem, pass_, SM90)
    assert not isinstance(default.loop, TmaHalo)
    assert any("slices of 64 output channels" in r and "not been timed" in r for r in default.reasons)
    got = candidates(problem, pass_, SM90)
    halo = [i for i, c in enumerate(got) if isinstance(c.loop, TmaHalo)]
    assert halo and halo == list(range(len(got) - len(halo), len(got)))  # the last ones, past autotune's first 8
    ks = emit(make_spec(problem, pass_, target=SM90, plan_=got[halo[0]]))
    slices = tma_halo.slices(problem.geometry, pass_)
    assert ks.main.grid_n_tiles == slices and f"constexpr int SLICES = {slices};" in ks.source
    assert ks.grid(1000)[0] == 132 // slices * slices  # whole sets of slices: no block without one
    one_sm = emit(make_spec(problem, pass_, target=Target(arch="sm_90", sm_count=1), plan_=got[halo[0]]))
    assert one_sm.grid(1000)[0] == slices  # even on one SM, a block per slice


def test_its_fields_are_checked_where_they_are_typed():
    with pytest.raises(ValueError, match=r"TmaHalo.pitch must be one of \(32, 64, 128\)"):
        TmaHalo(48)
    base = tma_halo.make(32)
    for change in (dict(block_m=64, warps_m=4), dict(block_n=128), dict(split_k=2), dict(stages=5)):
        with pytest.raises(ValueError, match="TmaHalo"):
            Plan(**{**{f: getattr(base, f) for f in ("block_m", "block_n", "block_k", "warps_m", "warps_n",
                                                       "stages", "vec_a", "vec_b", "split_k")}, **change},
                 loop=base.loop)


def test_its_plan_dict_round_trips_and_names_the_kind():
    p = tma_halo.make(64, 3)
    d = p.as_dict()
    assert d["tma"] is True and d["halo_pitch"] == 64 and "persistent" not in d
    assert Plan.from_dict(d) == p
    with pytest.raises(ValueError, match="halo_pitch=64 names the TMA halo loop"):
        Plan.from_dict({**d, "tma": False})
    # every other kind's dict is as it was: no halo_pitch key
    assert "halo_pitch" not in default_plan(_layer(56, 56, c=128), Pass.FPROP, SM90).as_dict()


def test_candidates_offer_every_pitch_and_ring_that_fits():
    got = [c for c in candidates(_layer(56, 56), Pass.FPROP, SM90) if isinstance(c.loop, TmaHalo)]
    assert {(c.loop.pitch, c.stages) for c in got} == {(32, 2), (32, 3), (64, 2), (64, 3), (128, 2)}  # 128 x 3: 257 KB
    assert not any(isinstance(c.loop, TmaHalo) for c in candidates(_layer(56, 56, c=128), Pass.FPROP, SM90))


@pytest.mark.parametrize("plan", [tma_halo.make(p, s) for p in (32, 64, 128) for s in (2, 3, 4)
                                  if tma_halo.smem_bytes(tma_halo.make(p, s), Pass.FPROP) <= SM90.smem_limit],
                         ids=lambda p: p.brief())
def test_the_launch_is_one_persistent_block_an_sm(plan):
    ks = emit(make_spec(_layer(13, 37, n=3), Pass.FPROP, target=SM90, plan_=plan))
    th, tw = 128 // plan.loop.pitch, plan.loop.pitch - 2
    tiles = 3 * -(-13 // th) * -(-37 // tw)
    assert ks.main.block == (384, 1, 1) and ks.grid(3) == (min(tiles, 132), 1, 1) and ks.grid(1000)[0] == 132
    assert ks.compile_arch == "sm_90a" and ks.main.args == ("x_map", "w_map", "y", "batch")


def _simulate(problem: ConvProblem, pass_: Pass, plan: Plan, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The kernel's algorithm in NumPy, driven by the constants the emitter wrote into it and
    its launch grid (on a 5-SM target, so blocks walk several tiles): block b takes slice
    b % SLICES and tiles b / SLICES, + gridDim.x / SLICES, ... as tile_at() walks them; the
    halo box from one pixel up and left (zeros outside the image), position m reading tap
    (r, s) at halo row m + r*PITCH + s, dgrad's taps multiplying the flipped tap's weights
    transposed, and the store's test.  Every output is written exactly once, or the poison
    (NaN) shows."""
    ks = emit(make_spec(problem, pass_, target=Target(arch="sm_90", sm_count=5), plan_=plan))
    src = ks.source
    const = {name: int(src.split(f"constexpr int {name} = ")[1].split(",")[0].split(";")[0]) if
             f"constexpr int {name} = " in src else int(src.split(f", {name} = ")[1].split(",")[0].split(";")[0])
             for name in ("PITCH", "TH", "TW", "TILES_H", "TILES_W")}
    n_slices = int(src.split("constexpr int SLICES = ")[1].split(";")[0]) if "constexpr int SLICES = " in src else 1
    pitch, th, tw, per_image = const["PITCH"], const["TH"], const["TW"], const["TILES_H"] * const["TILES_W"]
    n, h, wd = x.shape[:3]
    out_c = w.shape[0] if pass_ is Pass.FPROP else w.shape[3]
    out = np.full((n, h, wd, out_c), np.nan)
    padded = np.zeros((n, h + th + 2, wd + pitch + 2, 64))  # room for a box past the far edges (zeros)
    padded[:, 1:h + 1, 1:wd + 1] = x
    flip = "R * S - 1 - tap" in src
    grid = ks.grid(n)[0]
    assert grid % n_slices == 0, "the grid is whole sets of slices"
    walkers = grid // n_slices
    for b in range(grid):
        sl = slice(b % n_slices * 64, b % n_slices * 64 + 64)
        for t in range(b // n_slices, n * per_image, walkers):
            img, rest = t // per_image, t % per_image
            p0, q0 = rest // const["TILES_W"] * th, rest % const["TILES_W"] * tw
            box = padded[img, p0:p0 + th + 2, q0:q0 + pitch].reshape(-1, 64)  # (TH + 2) rows x PITCH columns
            box = np.concatenate([box, np.full((8, 64), 1e9)])  # the slot's tail: read by unstored positions only
            for m in range(128):
                p, q = p0 + m // pitch, q0 + m % pitch
                acc = np.zeros(64)
                for tap in range(9):
                    a = box[m + tap // 3 * pitch + tap % 3]
                    if flip:  # dgrad: B is w[k, flipped tap, c] for the slice's c
                        acc += a @ w[:, (8 - tap) // 3, (8 - tap) % 3, sl]
                    else:  # fprop: B^T is w[the slice's k, tap, c]
                        acc += a @ w[sl, tap // 3, tap % 3, :].T
                if m % pitch < tw and p < h and q < wd:
                    assert np.isnan(out[img, p, q, sl][0]), f"output ({img}, {p}, {q}) stored twice"
                    out[img, p, q, sl] = acc
    return out


@pytest.mark.parametrize("pass_", [Pass.FPROP, Pass.DGRAD])
@pytest.mark.parametrize("pitch, channels", [(32, 64), (64, 64), (128, 64), (32, 128), (64, 192)])
def test_the_tiling_covers_every_output_once_and_computes_the_convolution(pitch, channels, pass_):
    """`channels`: the output's (fprop's K, dgrad's C); above 64, slices of 64 a block."""
    problem = (_layer(5, 127, n=2, k=channels) if pass_ is Pass.FPROP  # 127: a column past whole tiles at every pitch
               else _layer(5, 127, n=2, c=channels))
    rng = np.random.default_rng()
    x = rng.standard_normal(problem.x_shape if pass_ is Pass.FPROP else problem.y_shape)
    w = rng.standard_normal(problem.w_shape)
    got = _simulate(problem, pass_, tma_halo.make(pitch), x, w)
    want = (reference.fprop(x, w, None, stride=1, padding=1, dilation=1) if pass_ is Pass.FPROP
            else reference.dgrad(x, w, problem.x_shape, stride=1, padding=1, dilation=1))
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-12


def test_the_emitted_kernel_reads_the_epilogue_it_was_given():
    p = _layer(56, 56)
    plain = emit(make_spec(p, Pass.FPROP, target=SM90)).source
    fused = emit(make_spec(p, Pass.FPROP, target=SM90, epilogue=Epilogue(bias=True, relu=True, residual=True)))
    assert "add_run(" not in plain.split("extern \"C\"")[1]
    body = fused.source.split("extern \"C\"")[1]
    assert "add_run(v, bias + n" in body and "scale_add_run(" in body and "v[e] < 0.0f" in body
    assert fused.main.args == ("x_map", "w_map", "bias", "residual", "alpha", "beta", "y", "batch")
