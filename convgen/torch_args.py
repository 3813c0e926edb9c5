"""convgen.torch's arguments: PyTorch's conventions checked and turned into the kernels'.

Kept apart from the operators and modules (convgen.torch) because none of it launches anything:
every check here runs before a kernel is planned, so a wrong argument is named in PyTorch's own
terms (x.shape[1], w.shape[0], groups, padding='same') rather than surfacing as a planner error;
and autocast is read here, once, so the front end has one place that decides which 16-bit type
the kernels multiply.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import torch

from convgen.ir import as_pair

_PairArg = Union[int, Sequence[int]]
_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _plan_padding(
    padding: Union[_PairArg, str], kernel: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int]
) -> tuple[tuple[int, int], tuple[int, int]]:
    """(symmetric padding for the kernels, extra (bottom, right) zeros to pad onto x first).

    'same' follows PyTorch exactly: a dilated filter extent of d*(k-1)+1 needs
    d*(k-1) padding in total, split as total//2 before and the rest after.  When
    the total is odd the split is uneven, which convgen's kernels (symmetric
    padding only) cannot express, so the one extra row/column goes onto the
    input with ``F.pad`` first, as ATen's own 'same' convolution does.
    """
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0), (0, 0)
        if padding != "same":
            raise ValueError(f"Invalid padding string {padding!r}, should be one of ('valid', 'same')")
        if stride != (1, 1):
            raise ValueError("padding='same' is not supported for strided convolutions")
        sym, extra = [], []
        for k, d in zip(kernel, dilation):
            total = d * (k - 1)
            sym.append(total // 2)
            extra.append(total - 2 * (total // 2))
        return (sym[0], sym[1]), (extra[0], extra[1])
    return as_pair("padding", padding), (0, 0)


def _check_operands(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], groups: int = 1) -> None:
    """Reject what the kernels would compute wrongly, naming the argument at fault."""
    for name, t in (("x", x), ("w", w), ("bias", bias)):
        if t is None and name == "bias":
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _SUPPORTED_DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {t.dtype}")
        if t.device != x.device:
            raise RuntimeError(f"{name} is on {t.device} but x is on {x.device}; all operands must be on one device")
    if {x.dtype, w.dtype} == {torch.float16, torch.bfloat16}:
        raise TypeError(f"x is {x.dtype} and w is {w.dtype}: the kernels multiply one 16-bit type; convert one "
                        "of them (a bfloat16 model's weights and inputs are both bfloat16)")
    if x.dim() != 4:
        raise ValueError(f"x must be 4-D (N, C, H, W) or 3-D (C, H, W), got shape {tuple(x.shape)}")
    if w.dim() != 4:
        raise ValueError(f"w must be 4-D (K, C, R, S) like nn.Conv2d.weight, got shape {tuple(w.shape)}")
    if groups != 1:
        _check_groups(groups, x.shape[1], w.shape[0], "x.shape[1]", "w.shape[0]")
    if w.shape[1] * groups != x.shape[1]:
        raise ValueError(
            f"w has {w.shape[1]} input channels (w.shape[1]) but x has {x.shape[1]} (x.shape[1]); "
            + ("w.shape[1] must be x.shape[1] (groups=1: a dense convolution)" if groups == 1 else
               f"with groups={groups}, w.shape[1] must be x.shape[1] / groups = {x.shape[1] // groups}")
        )
    if bias is not None and tuple(bias.shape) != (w.shape[0],):
        raise ValueError(f"bias must have shape ({w.shape[0]},) to match w's output channels, got {tuple(bias.shape)}")


def _check_groups(groups: Any, in_channels: int, out_channels: int, c_name: str, k_name: str) -> None:
    """groups must divide both channel counts, as torch.nn.Conv2d demands (checked here so the
    message names the argument, before any kernel is planned)."""
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"groups must be a positive integer, got {groups!r}")
    for count, name in ((in_channels, c_name), (out_channels, k_name)):
        if count % groups:
            raise ValueError(f"groups={groups} must divide the {count} channels of {name}: each group has "
                             f"{name} / groups of them")


def _autocasting() -> bool:
    """Whether CUDA autocast is on (then :func:`_conv2d` casts the operands itself)."""
    try:
        return torch.is_autocast_enabled("cuda")
    except TypeError:  # PyTorch before 2.4: no device argument, and it means CUDA
        return torch.is_autocast_enabled()


def _autocast_dtype() -> torch.dtype:
    """The type CUDA autocast asks for, as the kernels take it: float16 or bfloat16 (float16
    for any other)."""
    try:
        dt = torch.get_autocast_dtype("cuda")
    except (AttributeError, TypeError):  # PyTorch before 2.4
        dt = torch.get_autocast_gpu_dtype()
    return dt if dt in (torch.float16, torch.bfloat16) else torch.float16


def _autocast_cast(t: Any, dt: torch.dtype) -> Any:
    """An operand as autocast hands it to nn.Conv2d: a float16, bfloat16 or float32 tensor in
    ``dt`` (a cast autograd sees through); float64, non-floating and non-tensors as they are
    (the checks name what is wrong with those)."""
    if not isinstance(t, torch.Tensor) or t.dtype in (dt, torch.float64) or not t.is_floating_point():
        return t
    return t.to(dt)


def _autocast_off() -> Any:
    return torch.autocast("cuda", enabled=False)


def _check_module_options(in_channels: int, out_channels: int, groups: int, padding_mode: str) -> None:
    if groups != 1:
        _check_groups(groups, in_channels, out_channels, "in_channels", "out_channels")
    if padding_mode != "zeros":
        raise ValueError(
            f"convgen.torch.Conv2d supports padding_mode='zeros' only, got {padding_mode!r}; "
            "use torch.nn.Conv2d for reflect, replicate or circular padding"
        )
