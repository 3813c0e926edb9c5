"""Where does a training step's time go with convgen.torch?  Host time against GPU time per step,
the profiler's per-kernel GPU times and a cProfile of the host side, for the convgen and cuDNN nets
of examples/train_step.py (batch 256, fp16, channels_last).  Run on a GPU: python3 benchmarks/probes/train_step_profile.py"""
import cProfile, pstats, time, io
import torch, torch.nn as nn, torch.nn.functional as F
import convgen.torch as cgt
dev = torch.device("cuda"); cl = torch.channels_last
def make_net(conv):
    return nn.Sequential(conv(3, 32, 3, padding="same"), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        conv(32, 64, 3, padding="same"), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        conv(64, 128, 3, padding="same"), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))
torch.manual_seed(0); torch.backends.cudnn.benchmark = True
nets = {"convgen": make_net(cgt.Conv2d), "cuDNN": make_net(nn.Conv2d)}
x = torch.randn(256, 3, 32, 32).to(dev, torch.float16).contiguous(memory_format=cl)
labels = torch.randint(0, 10, (256,)).to(dev)
for name, m in nets.items():
    m.to(device=dev, dtype=torch.float16, memory_format=cl)
    opt = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
    def step():
        opt.zero_grad(set_to_none=True)
        (F.cross_entropy(m(x).float(), labels) * 1024).backward(); opt.step()
    for _ in range(10): step()
    torch.cuda.synchronize()
    t0 = time.perf_counter(); s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(50): step()
    t1 = time.perf_counter(); e.record(); e.synchronize(); t2 = time.perf_counter()
    print(f"{name}: host {1e3*(t1-t0)/50:.3f} ms/step issuing, wall {1e3*(t2-t0)/50:.3f}, events {s.elapsed_time(e)/50:.3f} ms/step")
    # forward only / backward only host costs
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(50):
        with torch.no_grad(): m(x)
    t1 = time.perf_counter(); torch.cuda.synchronize(); print(f"{name}: no-grad forward host {1e3*(t1-t0)/50:.3f} ms, wall {1e3*(time.perf_counter()-t0)/50:.3f}")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10): step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))
    if name == "convgen":
        pr = cProfile.Profile(); pr.enable()
        for _ in range(20): step()
        torch.cuda.synchronize(); pr.disable()
        out = io.StringIO(); pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(30); print(out.getvalue()[:9000])
        out = io.StringIO(); pstats.Stats(pr, stream=out).sort_stats("cumtime").print_stats(40); print(out.getvalue()[:9000])
