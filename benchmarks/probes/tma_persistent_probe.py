"""Probe: TMA tiles at several stage counts, one block per tile, persistent
(TmaWgmma(persistent=True)) and ping-pong (TmaWgmma(persistent=True, pingpong=True)), on
layers of the built-in suites, beside the planner's default and cuDNN, GPU time only
(tools/timing's interleaved CUDA-event method, L2 flushed).  It prints each kernel's
resident blocks per SM (the driver's occupancy) and its error against cuDNN's output.

    python3 benchmarks/probes/tma_persistent_probe.py --pass fprop [--set pingpong]   # writes $OUT/probe.json
    python3 benchmarks/probes/tma_persistent_probe.py --pass dgrad --set short --layers resnet50/l1-1x1b,resnet50/l2-1x1

Where the measurements behind tma_rules.PERSISTENT_TILES came from
(benchmarks/results/2026-12-02_h200_tma-persistent-probe_*)."""
import argparse, os, statistics, sys, time, json
import cupy as cp, torch, torch.nn.functional as F
import cupy_backends.cuda.api.driver as drv
import convgen
from convgen.autotune import _compile_all
from convgen.compile import detect_target
from convgen.emit import emit
from convgen.ir import Pass
from convgen.spec import Plan
from convgen.mainloop import TmaWgmma
from convgen.planner import make_spec, tma_eligible
from convgen.suites import SUITES
from convgen.tools.timing import CudaDevice, time_interleaved

FPROP_LAYERS = [("vgg16", "conv1_2"), ("vgg16", "conv2_1"), ("vgg16", "conv2_2"), ("vgg16", "conv3_1"), ("vgg16", "conv4_2"),
          ("resnet50", "l2-3x3"), ("resnet18", "l2-3x3"), ("unet", "enc3b"), ("unet", "enc2b"), ("darknet53-down", "down2"),
          ("resnet50", "l3-1x1"), ("resnet50", "l4-1x1")]
# (block_m, block_n, stages, 0 one block per tile | 1 persistent | 2 ping-pong)
VARIANTS = {
    "persistent": [(64, 64, 6, 0), (128, 64, 6, 0), (128, 128, 6, 0), (64, 256, 5, 0), (128, 256, 4, 0),
                   (64, 64, 3, 1), (64, 64, 6, 1), (64, 128, 3, 1), (64, 128, 6, 1), (128, 64, 6, 1), (128, 128, 4, 1),
                   (128, 128, 5, 1), (64, 256, 4, 1), (128, 256, 3, 1)],
    "pingpong": [(128, 64, 6, 1), (128, 128, 5, 1), (128, 256, 3, 1),
                 (128, 64, 4, 2), (128, 64, 6, 2), (128, 128, 3, 2), (128, 128, 4, 2), (128, 128, 5, 2)],
    # short reductions (1x1 layers, 1-4 K-steps), after the drain's reads were vectorised (ba4158a)
    "short": [(128, 128, 6, 0), (128, 256, 4, 0), (128, 64, 6, 1), (128, 128, 5, 1), (128, 256, 3, 1),
              (128, 64, 6, 2), (128, 128, 4, 2)],
}
DGRAD_LAYERS = [("vgg16", "conv1_2"), ("vgg16", "conv2_1"), ("vgg16", "conv2_2"), ("vgg16", "conv3_1"), ("vgg16", "conv4_2"),
                ("resnet50", "l2-3x3"), ("resnet18", "l2-3x3"), ("unet", "enc3b"), ("unet", "enc2b"),
                ("unet", "dec2-cat192"), ("darknet53-down", "down3"), ("darknet53-down", "down4"), ("resnet18", "l3-3x3")]
target = detect_target()
torch.backends.cudnn.benchmark = True
todo = []
ap = argparse.ArgumentParser()
ap.add_argument("--pass", dest="pass_", choices=("fprop", "dgrad"), default="fprop")
ap.add_argument("--set", dest="set_", choices=tuple(VARIANTS), default="persistent")
ap.add_argument("--layers", default="", help="suite/layer,... instead of the pass's list")
args = ap.parse_args()
if args.layers:
    FPROP_LAYERS = DGRAD_LAYERS = [tuple(x.split("/", 1)) for x in args.layers.split(",")]
PASS = Pass.parse(args.pass_)
for ps in (PASS,):
    for s, name in (FPROP_LAYERS if ps is Pass.FPROP else DGRAD_LAYERS):
        layer = next(l for l in SUITES[s] if l.name == name)
        p = layer.problem
        if tma_eligible(p.geometry, ps, target) is not None:
            continue
        plans = [("default", None)]
        for bm, bn, st, mode in VARIANTS[args.set_]:
            if bn > max(64, p.gemm(ps).n * 2) or (ps is Pass.DGRAD and bn % 64):
                continue
            plans.append((f"{bm}x{bn}s{st}{'P' * mode}",
                          Plan(bm, bn, 64, 8 if mode == 2 else bm // 16, 1, st, 8, 8, loop=TmaWgmma(mode > 0, mode == 2))))
        todo.append((ps, s, name, p, plans))
srcs = []
for ps, s, name, p, plans in todo:
    for _, pl in plans:
        try:
            src = emit(make_spec(p, ps, target=target, plan_=pl))
            srcs.append((src.source, src.compile_arch))
        except Exception as e:
            print("spec", name, pl, e)
t0 = time.time()
for i in range(0, len(srcs), 16):
    for why in _compile_all(srcs[i:i + 16], time.perf_counter() + 600):
        if why: print("compile:", why[:200])
print(f"compiled {len(srcs)} in {time.time()-t0:.0f}s", flush=True)
stream = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
out = []
with stream, torch.no_grad():
    dev = CudaDevice(cp, stream)
    for ps, s, name, p, plans in todo:
        g = torch.Generator(device="cuda"); g.manual_seed(1)
        x = torch.randn(p.x_shape, generator=g, device="cuda").half()
        w = (torch.randn(p.w_shape, generator=g, device="cuda") / (p.r * p.s * p.c) ** 0.5).half()
        dy = torch.randn(p.y_shape, generator=g, device="cuda").half()
        xt, wt, dyt = x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2), dy.permute(0, 3, 1, 2)
        geo = dict(stride=p.stride, padding=p.padding, dilation=p.dilation)
        if ps is Pass.FPROP:
            ca, cw, osh = cp.from_dlpack(x), cp.from_dlpack(w), p.y_shape
            ops = [("cudnn", lambda: F.conv2d(xt, wt, None, **geo))]
            ref = cp.from_dlpack(ops[0][1]().permute(0, 2, 3, 1).contiguous())
        else:
            ops = [("cudnn", lambda: torch.ops.aten.convolution_backward(dyt, xt, wt, None, list(p.stride), list(p.padding), list(p.dilation), False, [0, 0], 1, [True, False, False]))]
            ref = cp.from_dlpack(ops[0][1]()[0].permute(0, 2, 3, 1).contiguous())
            ca, cw, osh = cp.from_dlpack(dy), cp.from_dlpack(w), p.x_shape
        info = {}
        for lab, pl in plans:
            try:
                op = convgen.prepare(ps.value, p.x_shape, p.w_shape, plan=pl, **geo)
                y = cp.full(osh, cp.nan, dtype=cp.float16)
                op(ca, cw, out=y)
                a, b = y.astype(cp.float64), ref.astype(cp.float64)
                err = float(cp.linalg.norm(a - b) / cp.linalg.norm(b))
                fn = op._kernel.main
                src = op._kernel.source
                occ = drv.occupancyMaxActiveBlocksPerMultiprocessor(fn.ptr, src.main.block[0], src.main.shared_mem)
                info[lab] = (err, occ, src.spec.plan.brief(), src.main.shared_mem)
                ops.append((lab, lambda op=op, y=y: op(ca, cw, out=y)))
            except Exception as e:
                print(name, lab, type(e).__name__, str(e)[:200], flush=True)
        for _, f in ops: f()
        t = {k: statistics.median(v) for k, v in time_interleaved(dev, ops, 10).items()}
        gm = p.gemm(ps); tf = 2 * gm.m * gm.n * gm.k / 1e12
        print(f"== {ps.value} {s}/{name} M={gm.m} N={gm.n} K={gm.k}  cuDNN {tf/t['cudnn']*1e6:.0f} TF/s {t['cudnn']:.1f} us", flush=True)
        for lab in t:
            if lab == "cudnn": continue
            e, occ, br, sm = info[lab]
            print(f"   {lab:10s} {br:34s} occ {occ} smem {sm//1024:3d}K {t[lab]:8.1f} us {tf/t[lab]*1e6:5.0f} TF/s x{t['cudnn']/t[lab]:.2f} err {e:.1e}", flush=True)
        out.append(dict(pass_=ps.value, layer=f"{s}/{name}", us=t, info={k: list(v) for k, v in info.items()}))
json.dump(out, open(os.environ.get("OUT", ".") + "/probe.json", "w"), indent=1)
