"""convgen: a code generator for conv2d kernels specialised to one shape.

    import convgen
    y = convgen.conv2d(x, w, bias, stride=1, padding=1)          # CuPy arrays, NHWC / KRSC
    dx = convgen.conv2d_dgrad(dy, w, x.shape, padding=1)
    dw, db = convgen.conv2d_wgrad(x, dy, w.shape, padding=1)
    op = convgen.prepare("fprop", x.shape, w.shape, padding=1)   # bound once, launched cheaply
    op(x, w, out=y)

The IR (ConvProblem, Pass, Epilogue, Target), the planner and the emitter work
without a GPU or CuPy; only the run-time functions need them.
"""

__version__ = "0.1.0"

from .autotune import set_autotune
from .emit import KernelSource, emit
from .ir import ConvGeometry, ConvProblem, Epilogue, Pass, Target
from .spec import KernelSpec, Plan
from .planner import make_spec, plan
from .prepared import PreparedConv, prepare, prepare_many
from .runtime import clear_cache, conv2d, conv2d_dgrad, conv2d_wgrad

__all__ = [
    "__version__", "ConvGeometry", "ConvProblem", "Epilogue", "KernelSource", "KernelSpec",
    "Pass", "Plan", "PreparedConv", "Target", "clear_cache", "conv2d", "conv2d_dgrad", "conv2d_wgrad",
    "emit", "make_spec", "plan", "prepare", "prepare_many", "set_autotune",
]
