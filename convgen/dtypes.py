"""The element types: which 16-bit type a kernel's MMAs read, and which dtypes go with it.

A kernel stages one 16-bit element type in shared memory and feeds it to its MMAs (the
templates' ``half_t``): float16, as every kernel did first, or bfloat16 (8-bit mantissa,
float32's exponent range), with float32 accumulators either way.  Its inputs are that type,
or float32 rounded to it in the gather (or in one cast pass).  Its output and fprop's bias
are that type or float32: a kernel never mixes float16 and bfloat16, which would need a
second 16-bit type in the epilogue for no model we know.

The rules live here, not in :mod:`convgen.ir`, so the IR only calls :func:`check_dtypes`.
"""

from __future__ import annotations

from typing import Any, Literal

MmaDType = Literal["float16", "bfloat16"]
MMA_DTYPES: tuple[str, ...] = ("float16", "bfloat16")


def default_mma_dtype(in_dtype: str) -> str:
    """The MMA's input type when the caller does not choose: the inputs' own 16-bit type,
    and float16 for float32 inputs (what convgen always did)."""
    return "bfloat16" if in_dtype == "bfloat16" else "float16"


def resolve_mma_dtype(in_dtype: str, mma_dtype: Any = None) -> str:
    """``mma_dtype`` checked against ``in_dtype`` (None: :func:`default_mma_dtype`).

    float32 inputs may be rounded to either 16-bit type; 16-bit inputs are read as they are,
    so they fix the MMA's type (rounding float16 to bfloat16 would lose three mantissa bits
    behind the caller's back)."""
    if mma_dtype is None:
        return default_mma_dtype(in_dtype)
    if mma_dtype not in MMA_DTYPES:
        raise ValueError(f"mma_dtype must be one of {MMA_DTYPES} (the MMA's input type), got {mma_dtype!r}")
    if in_dtype in MMA_DTYPES and mma_dtype != in_dtype:
        raise ValueError(f"mma_dtype={mma_dtype!r} with in_dtype={in_dtype!r}: 16-bit inputs are read as they "
                         f"are, so the MMA reads {in_dtype}; only float32 inputs may be rounded to either type")
    return str(mma_dtype)


def check_dtypes(in_dtype: str, mma_dtype: str, out_dtype: str, bias_dtype: str) -> None:
    """Reject a kernel that would mix float16 and bfloat16, naming the field at fault."""
    resolve_mma_dtype(in_dtype, mma_dtype)
    for name, value in (("out_dtype", out_dtype), ("bias_dtype", bias_dtype)):
        if value not in (mma_dtype, "float32"):
            raise ValueError(f"{name}={value!r} with {mma_dtype} MMAs: a kernel's one 16-bit type is its MMA's, "
                             f"so {name} must be {mma_dtype!r} or 'float32'")


def bf16_refusal(target: Any) -> str | None:
    """Why ``target`` (a :class:`convgen.ir.Target`) cannot run bfloat16 MMAs, or None.

    Asked of the arch's capability, not its name: sm_75 and older have no bf16 tensor-core
    instruction (mma.sync .bf16 and WMMA's __nv_bfloat16 fragments start at sm_80)."""
    info = target.info
    if not info.bf16_mma:
        return (f"{target.arch} has no bfloat16 MMA (bf16 tensor-core instructions start at sm_80); "
                "use float16, or float32 inputs with mma_dtype='float16'")
    return None


def mma_dtype_for(in_dtype: str, mma_dtype: Any, target: Any) -> str:
    """The planner's one question: the MMA's type for these inputs on ``target``, refused by
    name (:func:`bf16_refusal`) where the target has no such MMA rather than planned in
    float16 behind the caller's back."""
    elem = resolve_mma_dtype(in_dtype, mma_dtype)
    why = bf16_refusal(target) if elem == "bfloat16" else None
    if why:
        raise ValueError(f"mma_dtype='bfloat16': {why}")
    return elem


# ---- the host side: NumPy/CuPy spellings ----
# NumPy and CuPy have no bfloat16 of their own; CuPy 14 takes ml_dtypes' (ml_dtypes.bfloat16,
# the type JAX and TensorFlow share), so a bfloat16 CuPy array is
# ``cupy.asarray(numpy_array.astype(ml_dtypes.bfloat16))`` or ``cupy.empty(shape, ml_dtypes.bfloat16)``.
BF16_HINT = ("bfloat16 arrays are CuPy arrays of ml_dtypes.bfloat16 (pip install ml_dtypes; CuPy 14 "
             "supports that dtype)")


def np_dtype(name: str) -> Any:
    """The NumPy dtype for one of :data:`convgen.ir.DTYPES` (bfloat16 through ml_dtypes)."""
    import numpy as np

    if name != "bfloat16":
        return np.dtype(name)
    try:
        import ml_dtypes
    except ImportError as exc:
        raise ImportError(f"{BF16_HINT}; ml_dtypes is not installed") from exc
    return np.dtype(ml_dtypes.bfloat16)


def dtype_name(value: Any) -> str | None:
    """A dtype argument's name ("float16", "bfloat16", ...: a name, a NumPy/CuPy dtype or a
    scalar type such as ``ml_dtypes.bfloat16``), or None when it names no dtype."""
    import numpy as np

    if value is None:
        return None
    if isinstance(value, str) and value == "bfloat16":
        return value
    try:
        return np.dtype(value).name
    except (TypeError, ValueError):
        return None
