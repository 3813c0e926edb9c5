"""convgen: a code generator for conv2d kernels specialised to one shape."""

__version__ = "0.1.0"
