"""The TMA loop's thread-block clusters (TmaWgmma.cluster = 2, fprop): the plan, its grid, its
tuning candidates and its kernels, with no GPU.  What the kernels compute is
tests/test_tma_cluster_gpu.py's job."""

from __future__ import annotations

import dataclasses

import pytest

from convgen import autotune
from convgen.candidates import candidates
from convgen.emit import emit
from convgen.ir import ConvProblem, Epilogue, Pass, Target
from convgen.mainloop import TmaHalo, TmaWgmma
from convgen.planner import check_plan, make_spec
from convgen.spec import Plan
from convgen.tools.sass import find_cuobjdump, kernel_sass

LAYER = ConvProblem(28, 28, 128, 256, 3, 3, 1, 1, 1, n=64)
SM90 = Target("sm_90", 132)
CLUSTERED = Plan(128, 128, 64, 8, 1, 5, 8, 8, loop=TmaWgmma(cluster=2))
PINGPONG = Plan(128, 128, 64, 8, 1, 5, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True, cluster=2))


def test_plan_round_trips_is_named_and_is_checked():
    d = CLUSTERED.as_dict()
    assert d["cluster"] == 2 and d["tma"] is True
    assert Plan.from_dict(d, LAYER.geometry, Pass.FPROP) == CLUSTERED
    assert Plan.from_dict(PINGPONG.as_dict(), LAYER.geometry, Pass.FPROP) == PINGPONG
    assert "cluster" not in dataclasses.replace(CLUSTERED, loop=TmaWgmma()).as_dict()  # old entries keep their keys
    assert "_tmac2_128x128x64_s5_" in make_spec(LAYER, Pass.FPROP, target=SM90, plan_=CLUSTERED).name
    assert "_tmappc2_128x128x64_s5_" in make_spec(LAYER, Pass.FPROP, target=SM90, plan_=PINGPONG).name
    assert "clusters of 2 blocks" in CLUSTERED.explain()
    with pytest.raises(ValueError, match="cluster must be 1 or 2"):
        TmaWgmma(cluster=4)
    with pytest.raises(ValueError, match="needs plan.tma=True"):
        Plan.from_dict({**Plan(128, 128, 32, 4, 2, 3, 8, 8).as_dict(), "cluster": 2})
    strided = dataclasses.replace(LAYER, stride=(2, 2))
    for pass_, problem in ((Pass.WGRAD, LAYER), (Pass.DGRAD, strided)):  # residue classes of unequal K-steps
        with pytest.raises(ValueError, match="in fprop and stride-1 dgrad"):
            check_plan(CLUSTERED, problem, pass_, SM90, "float16")
    check_plan(CLUSTERED, LAYER, Pass.FPROP, SM90, "float16")
    check_plan(CLUSTERED, LAYER, Pass.DGRAD, SM90, "float16")
    check_plan(CLUSTERED, strided, Pass.FPROP, SM90, "float16")  # fprop's blocks walk the same taps at any stride


def test_the_gpu_tests_plans_are_valid_on_their_shapes():
    """test_tma_cluster_gpu's plans pass the planner's checks on its shapes, so that file tests
    kernels, not refusals."""
    import test_tma_cluster_gpu
    from gpu_helpers import check_plans_pass_the_planner

    check_plans_pass_the_planner(test_tma_cluster_gpu, SM90)


def test_grid_is_whole_clusters():
    """A cluster's blocks are side by side along x, so x is even: one block per tile, and one
    more past the last M tile where their count is odd; a persistent grid of at most the
    blocks the GPU holds, rounded down to whole clusters, and never less than one cluster."""
    one = emit(make_spec(LAYER, Pass.FPROP, target=SM90, plan_=CLUSTERED))
    single = emit(make_spec(LAYER, Pass.FPROP, target=SM90, plan_=dataclasses.replace(CLUSTERED, loop=TmaWgmma())))
    m_tiles = -(-3 * 28 * 28 // 128)  # 19 tiles of 2352 rows
    assert single.grid(3) == (m_tiles, 2, 1) and one.grid(3) == (m_tiles + 1, 2, 1)
    assert one.grid(64) == single.grid(64) == (392, 2, 1)
    pp = emit(make_spec(LAYER, Pass.FPROP, target=Target("sm_90", 131), plan_=PINGPONG))
    assert pp.grid(64) == (130, 1, 1) and pp.grid(1) == (-(-784 // 128) * 2 + 2, 1, 1)
    assert emit(make_spec(LAYER, Pass.FPROP, target=Target("sm_90", 1), plan_=PINGPONG)).grid(64) == (2, 1, 1)
    # the manifest, for launchers in other languages, says the same
    assert one.manifest_entry()["kernels"][0]["grid"] == {"x": "ceil(ceil(batch * 784 / 128) / 2) * 2", "y": 2, "z": 1}
    assert pp.manifest_entry()["kernels"][0]["grid"]["x"] == "min(ceil(ceil(batch * 784 / 128) / 2) * 2 * 2, 130)"


def test_kernel_shares_the_weight_tile_between_the_clusters_blocks():
    src = emit(make_spec(LAYER, Pass.FPROP, target=SM90, plan_=CLUSTERED)).source
    assert "__cluster_dims__(CLUSTER, 1, 1)" in src and "constexpr int CLUSTER = 2, B_PART = B_BYTES / CLUSTER;" in src
    assert "tma_load_2d_multicast(a + A_BYTES + part * B_PART, &w_map, bar, tap * C + c0, tile_n + part * (BN / CLUSTER)" in src
    assert "ring_init(smem_raw, CONSUMERS * CLUSTER)" in src  # a stage waits for both blocks' consumers
    assert "mbar_arrive_cluster(&ring.empty[s], cluster_rank() ^ 1u);" in src
    assert src.rstrip().endswith("cluster_sync();  // no block leaves while another may still arrive on its barriers\n}")
    tail = emit(make_spec(dataclasses.replace(LAYER, c=96), Pass.FPROP, target=SM90, plan_=CLUSTERED)).source
    assert "tma_load_3d_multicast(a + A_BYTES + part * B_PART, &w_map, bar, c0, tap," in tail  # w as (C, R*S, K)
    pp = emit(make_spec(LAYER, Pass.FPROP, target=SM90, plan_=PINGPONG)).source
    assert "ring_init(smem_raw, 1 * CLUSTER)" in pp and "(t / N_TILES * CLUSTER + rank) * BM" in pp
    plain = emit(make_spec(LAYER, Pass.FPROP, target=SM90, plan_=dataclasses.replace(CLUSTERED, loop=TmaWgmma()))).source
    assert "CLUSTER" not in plain and "cluster_" not in plain and "multicast" not in plain
    dgrad = emit(make_spec(LAYER, Pass.DGRAD, target=SM90, plan_=PINGPONG)).source
    assert "__cluster_dims__(CLUSTER, 1, 1)" in dgrad and "ring_init(smem_raw, 1 * CLUSTER)" in dgrad
    assert ("tma_load_3d_multicast(a + A_BYTES + j * B_BOX_BYTES + part * B_BOX_PART, w_map, bar, tile_n + 64 * j, "
            "r * S + s,\n                            k0 + part * (BK / CLUSTER)") in dgrad
    # a block past the last tile copies and multiplies too: the other block's stages wait for its parts
    assert "tile_m >= class_rows" not in dgrad and "if (tile_m >= m_class) return;" not in dgrad
    assert "if (tile_m >= m_class) return;" in emit(make_spec(LAYER, Pass.DGRAD, target=SM90, plan_=dataclasses.replace(
        PINGPONG, loop=TmaWgmma(persistent=True, pingpong=True)))).source


def test_twins_are_offered_when_asked_for_last_and_in_fprop_only():
    """Only when asked for (`convgen tune --clusters`) until a GPU has run them, then after every
    other candidate but the untimed TMA halo slices, so tuning on first use (its first
    autotune.CANDIDATES) never times them; the default's twin first."""
    for problem in (LAYER, ConvProblem(14, 14, 1024, 256, 1, 1, 1, 0, 1, n=64),
                    ConvProblem(56, 56, 64, 128, 3, 3, 1, 1, 1, n=64)):  # the last also offers halo slices
        assert not any(getattr(p.loop, "cluster", 1) > 1 for p in candidates(problem, Pass.FPROP, SM90))
        plans = candidates(problem, Pass.FPROP, SM90, clusters=True)
        twins = [i for i, p in enumerate(plans) if isinstance(p.loop, TmaWgmma) and p.loop.cluster == 2]
        after = plans[twins[-1] + 1:] if twins else []
        assert twins and twins == list(range(twins[0], twins[0] + len(twins)))
        assert all(isinstance(p.loop, TmaHalo) for p in after)
        assert min(twins) >= autotune.CANDIDATES
        first = plans[twins[0]]
        assert dataclasses.replace(first, loop=dataclasses.replace(first.loop, cluster=1), reasons=()) == \
            dataclasses.replace(plans[0], reasons=())
        assert not any(getattr(p.loop, "cluster", 1) > 1 for p in candidates(problem, Pass.WGRAD, SM90, clusters=True))
        dgrad = candidates(problem, Pass.DGRAD, SM90, clusters=True)
        assert any(getattr(p.loop, "cluster", 1) > 1 for p in dgrad) == isinstance(dgrad[0].loop, TmaWgmma)
        strided = dataclasses.replace(problem, stride=(2, 2))
        assert not any(getattr(p.loop, "cluster", 1) > 1 for p in candidates(strided, Pass.DGRAD, SM90, clusters=True))


CUOBJDUMP = find_cuobjdump()


@pytest.mark.skipif(CUOBJDUMP is None, reason="no cuobjdump: install the cuda13 or cuda12 extra")
@pytest.mark.parametrize("layer,plan,pass_", [
    (LAYER, CLUSTERED, Pass.FPROP),
    (LAYER, PINGPONG, Pass.FPROP),
    (dataclasses.replace(LAYER, c=96), Plan(64, 48, 64, 4, 1, 4, 8, 8, loop=TmaWgmma(persistent=True, cluster=2)),
     Pass.FPROP),
    (ConvProblem(14, 14, 256, 256, 3, 3, 1, 1, 1, 4, n=8), Plan(128, 64, 64, 8, 1, 4, 8, 8, loop=TmaWgmma(cluster=2)),
     Pass.FPROP),
    (LAYER, Plan(128, 128, 64, 8, 1, 4, 8, 8, loop=TmaWgmma(persistent=True, cluster=2)), Pass.DGRAD),
], ids=["2d", "pingpong", "3d-tail", "grouped", "dgrad"])
def test_nvrtc_compiles_one_multicast_copy_of_the_weights(layer, plan, pass_):
    """NVRTC's sm_90a SASS: the weights' copy is a multicast one, the activations' im2col copy
    is not, and no register spills.  (dgrad's w is 3-D.)"""
    epi = Epilogue(bias=pass_ is Pass.FPROP)
    spec = make_spec(layer, pass_, target=SM90, plan_=plan, epilogue=epi)
    sass = kernel_sass(emit(spec), CUOBJDUMP)[emit(spec).main.kernel]
    tma = {op: n for op, n in sass.opcodes.items() if op.startswith("UTMALDG")}
    three_d = layer.c % 64 or pass_ is Pass.DGRAD
    assert tma.keys() == {"UTMALDG.4D.IM2COL", "UTMALDG.3D.MULTICAST" if three_d else "UTMALDG.2D.MULTICAST"}, tma
    assert sass.local == 0 and sass.stack == 0


def test_each_block_maps_its_part_of_the_weight_tile(tma_encodes):
    """The weight map's box is BN / 2 filters (a block copies half of each B tile and
    multicasts it), the activations' im2col box is the whole BM: a wrong box would bring
    other byte counts than the stage's barrier expects, and the kernel would hang."""
    from convgen import tma

    def boxes():
        return {e["ptr"]: e["box"] for e in tma_encodes}

    for cluster, ptr in ((1, 1024), (2, 2048)):
        maps = tma.TmaMaps(LAYER, Pass.FPROP, 128, 128, cluster=cluster)
        maps.a(ptr), maps.b(ptr + 512)
        assert boxes()[ptr] == [64, 128] and boxes()[ptr + 512] == [64, 128 // cluster]
    tail = dataclasses.replace(LAYER, c=96)  # w as (C, R*S, K): a box of 64 channels, one tap, BN / 2 filters
    tma.TmaMaps(tail, Pass.FPROP, 128, 128, cluster=2).b(4096)
    assert boxes()[4096] == [64, 1, 64]
    tma.TmaMaps(LAYER, Pass.DGRAD, 128, 128, cluster=2).b(8192)  # dgrad: half of each box's 64 filters
    assert boxes()[8192] == [64, 1, 32]
