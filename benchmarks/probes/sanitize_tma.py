"""Probe: run a sample of TMA main-loop kernels (TmaWgmma, TmaHalo) once each, for compute-sanitizer.

    compute-sanitizer --tool memcheck --report-api-errors no python3 benchmarks/probes/sanitize_tma.py
    compute-sanitizer --tool racecheck python3 benchmarks/probes/sanitize_tma.py
    compute-sanitizer --tool racecheck python3 benchmarks/probes/sanitize_tma.py halo   # the TmaHalo cases only
    compute-sanitizer --tool racecheck python3 benchmarks/probes/sanitize_tma.py streamk   # stream-K wgrad only
    compute-sanitizer --tool racecheck python3 benchmarks/probes/sanitize_tma.py cluster   # clusters of two (fprop)
    compute-sanitizer --tool racecheck python3 benchmarks/probes/sanitize_tma.py store   # outputs by the copy engine

Small shapes with M, N and padding tails, both consumer counts, all three passes (dgrad
strided too, wgrad
with db, whose reader warps share the ring, split and not), and a check against the float64
reference so a run that the sanitizer passes also computed the right numbers."""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

import cupy as cp

import convgen
from convgen import reference
from convgen.ir import ConvProblem
from convgen.spec import Plan
from convgen import tma_halo
from convgen.mainloop import TmaWgmma

CASES = [
    (ConvProblem(9, 11, 64, 40, 3, 3, 1, 1, 1, n=2), Plan(128, 64, 64, 8, 1, 3, 8, 8, loop=TmaWgmma())),
    (ConvProblem(10, 9, 128, 72, 3, 5, (2, 1), (1, 2), (1, 2), n=2), Plan(64, 128, 64, 4, 1, 4, 8, 8, loop=TmaWgmma())),
    (ConvProblem(7, 7, 64, 256, 1, 1, 1, 0, 1, n=3), Plan(128, 256, 64, 8, 1, 2, 8, 8, loop=TmaWgmma())),
    # persistent: 576 and 1,152 tiles on 132 SMs, so each block walks several, M and N tails among them
    (ConvProblem(24, 24, 64, 72, 3, 3, 1, 1, 1, n=64), Plan(128, 64, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True))),
    (ConvProblem(24, 24, 64, 40, 3, 3, 1, 1, 1, n=64), Plan(64, 64, 64, 4, 1, 3, 8, 8, loop=TmaWgmma(persistent=True))),
    # 1x1 channel tails: the last step's boxes run past C in x and w (one box part zeros; three and a tail)
    (ConvProblem(14, 14, 40, 72, 1, 1, 1, 0, 1, n=8), Plan(128, 64, 64, 8, 1, 6, 8, 8,
                                                          loop=TmaWgmma(persistent=True, pingpong=True))),
    (ConvProblem(9, 11, 200, 136, 1, 1, 2, 0, 1, n=3), Plan(64, 128, 64, 4, 1, 4, 8, 8, loop=TmaWgmma())),
]

DGRAD_CASES = [
    (ConvProblem(9, 11, 40, 64, 3, 3, 1, 1, 1, n=2), Plan(128, 64, 64, 8, 1, 3, 8, 8, loop=TmaWgmma())),
    (ConvProblem(10, 9, 136, 72, 3, 5, 1, (1, 2), (1, 2), n=2), Plan(64, 128, 64, 4, 1, 4, 8, 8, loop=TmaWgmma())),
    # strided: residue classes of unequal taps and sizes, and (1x1) classes no tap reaches
    (ConvProblem(13, 11, 40, 72, 3, 3, 2, 1, 1, n=2), Plan(128, 64, 64, 8, 1, 3, 8, 8, loop=TmaWgmma())),
    (ConvProblem(10, 9, 64, 136, 1, 1, 2, 0, 1, n=2), Plan(64, 64, 64, 4, 1, 2, 8, 8, loop=TmaWgmma())),
    # persistent, walking several tiles a block: one class, then four of unequal taps
    (ConvProblem(24, 24, 72, 64, 3, 3, 1, 1, 1, n=64), Plan(128, 64, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True))),
    (ConvProblem(33, 31, 64, 64, 3, 3, 2, 1, 1, n=48), Plan(128, 64, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True))),
]
WGRAD_CASES = [
    (ConvProblem(9, 11, 64, 40, 3, 3, 1, 1, 1, n=2), Plan(128, 64, 64, 8, 1, 3, 8, 8, split_k=3, loop=TmaWgmma())),
    (ConvProblem(10, 9, 128, 72, 3, 5, (2, 1), (1, 2), (1, 2), n=2),
     Plan(64, 128, 64, 4, 1, 4, 8, 8, loop=TmaWgmma())),
]

# TmaHalo, fprop and dgrad: 13x37 images on every pitch (row and column tails, a tile's
# positions between rows and past the image), 3 and 24 of them (78-360 tiles: blocks that walk
# several, the ring wrapping), a ring of 2 and of 3.
HALO_CASES = [(ConvProblem(13, 37, 64, 64, 3, 3, 1, 1, 1, n=n), tma_halo.make(pitch, ring))
              for n, pitch, ring in ((3, 32, 2), (24, 32, 3), (24, 64, 2), (3, 128, 2))]
# Stream-K wgrad (with db, whose reader warps walk every segment): tiles cut between many
# blocks (5 steps a tile), in two or three (72 tiles of 25 steps), and run whole (288 tiles).
STREAM_K_CASES = [
    (ConvProblem(9, 11, 64, 16, 3, 3, 1, 1, 1, n=3), Plan(128, 256, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True))),
    (ConvProblem(14, 14, 128, 256, 3, 3, 1, 1, 1, n=8), Plan(64, 64, 64, 4, 1, 4, 8, 8, loop=TmaWgmma(persistent=True))),
    (ConvProblem(7, 7, 256, 512, 3, 3, 1, 1, 1, n=2), Plan(64, 64, 64, 4, 1, 4, 8, 8, loop=TmaWgmma(persistent=True))),
]
# ... and each cut tile summed by the block that began it, after a grid-wide barrier (split_reduce "grid")
STREAM_K_CASES += [(problem, dataclasses.replace(plan, split_reduce="grid")) for problem, plan in STREAM_K_CASES]
# Clusters of two (fprop): an odd number of M tiles (a block past them), a channel tail (the
# 3-D weight map's multicast), persistent and ping-pong walking several runs of two tiles.
CLUSTER_CASES = [
    (ConvProblem(9, 11, 64, 40, 3, 3, 1, 1, 1, n=3), Plan(128, 64, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(cluster=2))),
    (ConvProblem(9, 11, 96, 48, 3, 3, 1, 1, 1, n=2), Plan(64, 48, 64, 4, 1, 2, 8, 8, loop=TmaWgmma(cluster=2))),
    (ConvProblem(24, 24, 64, 72, 3, 3, 1, 1, 1, n=64),
     Plan(128, 64, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True, cluster=2))),
    (ConvProblem(24, 24, 64, 136, 3, 3, 1, 1, 1, n=64),
     Plan(128, 128, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True, cluster=2))),
]
# y stored by the copy engine (fprop): strips past K and past the batch, a persistent block's
# warps carrying their two strips across tiles (and one strip a tile: BN 16), ping-pong.
STORE_CASES = [
    (ConvProblem(9, 11, 64, 40, 3, 3, 1, 1, 1, n=3), Plan(128, 64, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(tma_store=True))),
    (ConvProblem(24, 24, 64, 72, 3, 3, 1, 1, 1, n=64),
     Plan(128, 64, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True, tma_store=True))),
    (ConvProblem(24, 24, 64, 16, 3, 3, 1, 1, 1, n=64),
     Plan(64, 16, 64, 4, 1, 3, 8, 8, loop=TmaWgmma(persistent=True, tma_store=True))),
    (ConvProblem(24, 24, 64, 136, 3, 3, 1, 1, 1, n=64),
     Plan(128, 128, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True, tma_store=True))),
]
STORE_DGRAD_CASES = [
    (ConvProblem(9, 11, 40, 64, 3, 3, 1, 1, 1, n=3), Plan(128, 64, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(tma_store=True))),
    (ConvProblem(24, 24, 72, 64, 3, 3, 1, 1, 1, n=64),
     Plan(128, 64, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True, tma_store=True))),
]
CLUSTER_DGRAD_CASES = [
    (ConvProblem(9, 11, 64, 40, 3, 3, 1, 1, 1, n=3), Plan(128, 64, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(cluster=2))),
    (ConvProblem(24, 24, 72, 64, 3, 3, 1, 1, 1, n=64),
     Plan(128, 64, 64, 8, 1, 3, 8, 8, loop=TmaWgmma(persistent=True, pingpong=True, cluster=2))),
]
if sys.argv[1:] == ["halo"]:
    CASES, WGRAD_CASES, DGRAD_CASES = HALO_CASES, [], HALO_CASES
elif sys.argv[1:] == ["streamk"]:
    CASES, WGRAD_CASES, DGRAD_CASES = [], STREAM_K_CASES, []
elif sys.argv[1:] == ["cluster"]:
    CASES, WGRAD_CASES, DGRAD_CASES = CLUSTER_CASES, [], CLUSTER_DGRAD_CASES
elif sys.argv[1:] == ["store"]:
    CASES, WGRAD_CASES, DGRAD_CASES = STORE_CASES, [], STORE_DGRAD_CASES
else:
    WGRAD_CASES = WGRAD_CASES + STREAM_K_CASES
    CASES, DGRAD_CASES = CASES + HALO_CASES + CLUSTER_CASES + STORE_CASES, DGRAD_CASES + HALO_CASES + CLUSTER_DGRAD_CASES + STORE_DGRAD_CASES

rng = np.random.default_rng(7)
geo = lambda prob: dict(stride=prob.stride, padding=prob.padding, dilation=prob.dilation)  # noqa: E731
for prob, plan in DGRAD_CASES:
    dy = rng.integers(-2, 3, size=prob.y_shape).astype(np.float16)
    w = rng.integers(-2, 3, size=prob.w_shape).astype(np.float16)
    dx = convgen.conv2d_dgrad(cp.asarray(dy), cp.asarray(w), prob.x_shape, out_dtype="float32", plan=plan, **geo(prob))
    ref = reference.dgrad(dy.astype(np.float64), w.astype(np.float64), prob.x_shape, **geo(prob))
    bad = int((cp.asnumpy(dx).astype(np.float64) != ref).sum())
    print(f"dgrad {prob.describe()} {plan.brief()}: {bad} of {ref.size} outputs differ from the exact reference")
for prob, plan in WGRAD_CASES:
    x = rng.integers(-2, 3, size=prob.x_shape).astype(np.float16)
    dy = rng.integers(-2, 3, size=prob.y_shape).astype(np.float16)
    dw, db = convgen.conv2d_wgrad(cp.asarray(x), cp.asarray(dy), prob.w_shape, bias=True, out_dtype="float32",
                                  plan=plan, **geo(prob))
    rdw, rdb = reference.wgrad(x.astype(np.float64), dy.astype(np.float64), prob.w_shape, **geo(prob))
    bad = int((cp.asnumpy(dw).astype(np.float64) != rdw).sum()) + int((cp.asnumpy(db).astype(np.float64) != rdb).sum())
    print(f"wgrad {prob.describe()} {plan.brief()}: {bad} of {rdw.size + rdb.size} outputs differ from the exact reference")
for prob, plan in CASES:
    x = rng.integers(-2, 3, size=prob.x_shape).astype(np.float16)
    w = rng.integers(-2, 3, size=prob.w_shape).astype(np.float16)
    y = convgen.conv2d(cp.asarray(x), cp.asarray(w), stride=prob.stride, padding=prob.padding,
                       dilation=prob.dilation, out_dtype="float32", plan=plan)
    ref = reference.fprop(x.astype(np.float64), w.astype(np.float64), None, stride=prob.stride,
                          padding=prob.padding, dilation=prob.dilation)
    bad = int((cp.asnumpy(y).astype(np.float64) != ref).sum())
    print(f"fprop {prob.describe()} {plan.brief()}: {bad} of {ref.size} outputs differ from the exact reference")
