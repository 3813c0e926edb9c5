"""What the side-by-side probes share: cuDNN through PyTorch on the probe's own stream, and one
row of interleaved medians (the bench's method: convgen.tools.timing).

PyTorch must launch on the stream the timing events are recorded on: at 5bf5603
group_pack_probe.py's cuDNN kernels ran on PyTorch's own stream, and its cuDNN column timed
nothing (1.6 us).
"""

from __future__ import annotations

import contextlib
import statistics
from typing import Any, Callable, Iterator, Optional, Sequence

from convgen.tools.timing import CudaDevice, time_interleaved


def torch_with_cudnn() -> Optional[Any]:
    """PyTorch with ``cudnn.benchmark`` on, or None without a CUDA build of it."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cudnn.benchmark = True
    return torch


@contextlib.contextmanager
def one_stream(cp: Any, torch: Optional[Any]) -> Iterator[CudaDevice]:
    """A non-blocking CuPy stream that CuPy and (given) PyTorch both launch on, and the timer on it."""
    stream = cp.cuda.Stream(non_blocking=True)
    with contextlib.ExitStack() as stack:
        stack.enter_context(stream)
        if torch is not None:
            stack.enter_context(torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)))
        yield CudaDevice(cp, stream)


def medians(dev: CudaDevice, ops: Sequence[tuple[str, Callable[[], Any]]], reps: int) -> dict[str, float]:
    """Each op's median GPU time (us) over ``reps`` interleaved reps, after two warm-up calls each
    (compiles, module loads, cuDNN's own tuning)."""
    for _, fn in ops:
        fn()
        fn()
    return {name: statistics.median(times) for name, times in time_interleaved(dev, ops, reps).items()}


def cudnn_op(torch: Any, pass_: str, tx: Any, tw: Any, tdy: Any, problem: Any) -> Callable[[], Any]:
    """cuDNN's side of one pass on NCHW views of the probe's tensors, the same work as convgen's:
    fprop conv(x, w) without bias, dgrad dx alone, wgrad dW alone (`convolution_backward`'s mask)."""
    g = problem
    stride, padding, dilation = list(g.stride), list(g.padding), list(g.dilation)
    if pass_ == "fprop":
        return lambda: torch.nn.functional.conv2d(tx, tw, stride=stride, padding=padding, dilation=dilation,
                                                  groups=g.groups)
    mask = [True, False, False] if pass_ == "dgrad" else [False, True, False]
    return lambda: torch.ops.aten.convolution_backward(tdy, tx, tw, None, stride, padding, dilation, False, [0, 0],
                                                       g.groups, mask)
