"""Train a small CIFAR-style CNN on synthetic data with CuPy and convgen alone.

For the authors of NumPy/CuPy frameworks: every convolution pass (forward with its bias
and ReLU fused, dgrad, wgrad with db) is a prepared convgen op (``convgen.prepare``), and
everything else (pooling, the classifier, the loss, SGD) is plain CuPy.  The buffers are
allocated once, every op writes into them (``out=``), and the whole training step can
therefore be captured in one CUDA graph through CuPy's stream capture and replayed.

    python3 examples/cupy_train.py [--batch 256] [--steps 50]

It prints the loss as it falls, then ms/step run eagerly and replayed as one CUDA graph,
and checks that both give the same parameters after the same steps.
"""

from __future__ import annotations

import argparse
import time

import cupy as cp
import numpy as np

import convgen

# (C, K, stride) of the three 3x3 layers on a 32x32 input; each is conv + bias + ReLU.
LAYERS = ((3, 32, 1), (32, 64, 2), (64, 128, 2))
CLASSES = 10


class Net:
    """Parameters, prepared ops and every activation and gradient buffer of one batch size."""

    def __init__(self, batch: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.batch = batch
        self.convs = []
        h = 32
        for c, k, stride in LAYERS:
            p = (h + 2 - 3) // stride + 1
            x_shape, w_shape, y_shape = (batch, h, h, c), (k, 3, 3, c), (batch, p, p, k)
            geo = dict(stride=stride, padding=1)
            layer = {
                "w": cp.asarray(rng.standard_normal(w_shape) * np.sqrt(2.0 / (9 * c)), dtype=cp.float16),
                "b": cp.zeros(k, cp.float32),
                "fprop": convgen.prepare("fprop", x_shape, w_shape, bias=True, activation="relu", **geo),
                "wgrad": convgen.prepare("wgrad", x_shape, w_shape, bias=True, **geo),
                "dgrad": convgen.prepare("dgrad", x_shape, w_shape, **geo) if c != 3 else None,
                "y": cp.empty(y_shape, cp.float16),      # relu(conv + b)
                "dy": cp.empty(y_shape, cp.float16),     # gradient before the ReLU
                "dx": cp.empty(x_shape, cp.float16) if c != 3 else None,
                "dw": cp.empty(w_shape, cp.float16),
                "db": cp.empty(k, cp.float16),
            }
            ws = max(op.workspace_elems for op in (layer["fprop"], layer["wgrad"], layer["dgrad"]) if op)
            layer["ws"] = cp.empty(max(ws, 1), cp.float32)
            self.convs.append(layer)
            h = p
        self.feat = LAYERS[-1][1]
        self.fc_w = cp.asarray(rng.standard_normal((self.feat, CLASSES)) * np.sqrt(1.0 / self.feat), dtype=cp.float32)
        self.fc_b = cp.zeros(CLASSES, cp.float32)
        self.pooled = cp.empty((batch, self.feat), cp.float32)
        self.logits = cp.empty((batch, CLASSES), cp.float32)
        self.dlogits = cp.empty((batch, CLASSES), cp.float32)
        self.nll = cp.empty(batch, cp.float32)
        self.g_last = cp.empty_like(self.convs[-1]["y"])
        self.fc_dw = cp.empty_like(self.fc_w)
        self.fc_db = cp.empty_like(self.fc_b)
        self.loss = cp.zeros((), cp.float32)
        self.x = cp.empty((batch, 32, 32, 3), cp.float16)
        self.labels = cp.empty(batch, cp.int32)

    def parameters(self) -> list:
        return [t for l in self.convs for t in (l["w"], l["b"])] + [self.fc_w, self.fc_b]


# The non-convolution parts: small elementwise kernels with loops, so every one writes into
# a buffer the net owns (nothing allocates inside the step, which a graph capture needs).
_pool = cp.ElementwiseKernel(  # pooled[n, f] = mean over pixels of y[n, :, :, f]
    "raw float16 y, int32 pix, int32 feat", "float32 pooled",
    "int n = i / feat, f = i % feat; float acc = 0.f;"
    "for (int j = 0; j < pix; ++j) acc += (float)y[((long long)n * pix + j) * feat + f];"
    "pooled = acc / pix;", "convgen_example_pool")
_fc = cp.ElementwiseKernel(  # logits[n, j] = pooled[n, :] . W[:, j] + b[j]
    "raw float32 x, raw float32 w, raw float32 b, int32 feat, int32 classes", "float32 logits",
    "int n = i / classes, j = i % classes; float acc = b[j];"
    "for (int f = 0; f < feat; ++f) acc += x[n * feat + f] * w[f * classes + j];"
    "logits = acc;", "convgen_example_fc")
_softmax_ce = cp.ElementwiseKernel(  # one row per thread: d(mean cross-entropy)/dlogits and the row's loss
    "raw float32 logits, raw int32 label, int32 classes, float32 inv_batch", "raw float32 grad, float32 nll",
    "const float* z = &logits[i * classes]; float mx = z[0];"
    "for (int j = 1; j < classes; ++j) mx = fmaxf(mx, z[j]);"
    "float denom = 0.f; for (int j = 0; j < classes; ++j) denom += expf(z[j] - mx);"
    "for (int j = 0; j < classes; ++j)"
    "  grad[i * classes + j] = (expf(z[j] - mx) / denom - (j == label[i] ? 1.f : 0.f)) * inv_batch;"
    "nll = -(z[label[i]] - mx - logf(denom)) * inv_batch;", "convgen_example_softmax_ce")
_fc_dw = cp.ElementwiseKernel(  # dW[f, j] = sum_n pooled[n, f] dlogits[n, j]
    "raw float32 x, raw float32 g, int32 batch, int32 feat, int32 classes", "float32 dw",
    "int f = i / classes, j = i % classes; float acc = 0.f;"
    "for (int n = 0; n < batch; ++n) acc += x[n * feat + f] * g[n * classes + j];"
    "dw = acc;", "convgen_example_fc_dw")
_fc_db = cp.ElementwiseKernel(
    "raw float32 g, int32 batch, int32 classes", "float32 db",
    "float acc = 0.f; for (int n = 0; n < batch; ++n) acc += g[n * classes + i]; db = acc;",
    "convgen_example_fc_db")
_unpool = cp.ElementwiseKernel(  # gradient of the pool and the classifier, as fp16 NHWC
    "raw float32 g, raw float32 w, int32 pix, int32 feat, int32 classes", "float16 dy",
    "int f = i % feat; long long n = i / ((long long)pix * feat); float acc = 0.f;"
    "for (int j = 0; j < classes; ++j) acc += g[n * classes + j] * w[f * classes + j];"
    "dy = (float16)(acc / pix);", "convgen_example_unpool")
_relu_grad = cp.ElementwiseKernel(
    "float16 g, float16 y", "float16 dy", "dy = y > (float16)0 ? g : (float16)0", "convgen_example_relu_grad")
_sgd = cp.ElementwiseKernel(
    "T grad, float32 lr", "P param", "param = (P)((float)param - lr * (float)grad)", "convgen_example_sgd")


def train_step(net: Net, lr: float) -> None:
    """Forward, loss, backward and SGD, writing only into the net's buffers (graph-capturable)."""
    a = net.x
    for l in net.convs:
        l["fprop"](a, l["w"], l["b"], out=l["y"], workspace=l["ws"])
        a = l["y"]
    pix = a.shape[1] * a.shape[2]
    _pool(a, np.int32(pix), np.int32(net.feat), net.pooled)
    _fc(net.pooled, net.fc_w, net.fc_b, np.int32(net.feat), np.int32(CLASSES), net.logits)
    _softmax_ce(net.logits, net.labels, np.int32(CLASSES), np.float32(1.0 / net.batch), net.dlogits, net.nll)
    net.nll.sum(out=net.loss)
    _fc_dw(net.pooled, net.dlogits, np.int32(net.batch), np.int32(net.feat), np.int32(CLASSES), net.fc_dw)
    _fc_db(net.dlogits, np.int32(net.batch), np.int32(CLASSES), net.fc_db)
    g = net.g_last
    _unpool(net.dlogits, net.fc_w, np.int32(pix), np.int32(net.feat), np.int32(CLASSES), g)
    for i in reversed(range(len(net.convs))):
        l = net.convs[i]
        _relu_grad(g, l["y"], l["dy"])
        x_in = net.x if i == 0 else net.convs[i - 1]["y"]
        l["wgrad"](x_in, l["dy"], out=(l["dw"], l["db"]), workspace=l["ws"])
        if l["dgrad"] is not None:
            l["dgrad"](l["dy"], l["w"], out=l["dx"], workspace=l["ws"])
            g = l["dx"]
    for l in net.convs:
        _sgd(l["dw"], np.float32(lr), l["w"])
        _sgd(l["db"], np.float32(lr), l["b"])
    _sgd(net.fc_dw, np.float32(lr), net.fc_w)
    _sgd(net.fc_db, np.float32(lr), net.fc_b)


def synthetic_batch(net: Net, rng: np.random.Generator, templates: np.ndarray) -> None:
    """A learnable task: each class is a fixed random image plus noise."""
    labels = rng.integers(0, CLASSES, net.batch)
    x = templates[labels] + 0.5 * rng.standard_normal((net.batch, 32, 32, 3))
    net.x.set(x.astype(np.float16))
    net.labels.set(labels.astype(np.int32))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    templates = rng.standard_normal((CLASSES, 32, 32, 3))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        net = Net(args.batch)
        synthetic_batch(net, rng, templates)
        for step in range(args.steps):  # eager: also compiles every kernel before the capture
            synthetic_batch(net, rng, templates)
            train_step(net, args.lr)
            if step % 10 == 0 or step == args.steps - 1:
                print(f"step {step:3d}  loss {float(net.loss):.4f}")
        stream.synchronize()

        reps = 50
        t0 = time.perf_counter()
        for _ in range(reps):
            train_step(net, args.lr)
        stream.synchronize()
        eager_ms = (time.perf_counter() - t0) / reps * 1e3

        # The same step as one CUDA graph.  Identical starting parameters for both runs, to
        # compare them after the same number of steps.
        start = [p.copy() for p in net.parameters()]
        stream.begin_capture()
        train_step(net, args.lr)
        graph = stream.end_capture()
        for p, s in zip(net.parameters(), start):
            p[...] = s
        graph.upload(stream)
        graph.launch(stream)
        stream.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            graph.launch(stream)
        stream.synchronize()
        graph_ms = (time.perf_counter() - t0) / reps * 1e3
        after_graph = [p.copy() for p in net.parameters()]
        for p, s in zip(net.parameters(), start):
            p[...] = s
        for _ in range(reps + 1):
            train_step(net, args.lr)
        stream.synchronize()
        same = all(bool(cp.array_equal(a, b)) for a, b in zip(after_graph, net.parameters()))
    print(f"batch {args.batch}: eager {eager_ms:.3f} ms/step, one CUDA graph {graph_ms:.3f} ms/step; "
          f"graph and eager parameters after {reps + 1} steps identical: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
