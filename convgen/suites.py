"""Built-in layer suites: the shapes `convgen emit`, `convgen bench` and the tests use
when the user gives none.  Plain data; each layer is a :class:`ConvProblem`."""

from __future__ import annotations

from dataclasses import dataclass

from .ir import ConvProblem


@dataclass(frozen=True)
class Layer:
    name: str
    problem: ConvProblem


def _layer(name: str, n: int, hw: int, c: int, k: int, f: int = 3, stride: int = 1, pad: int | None = None) -> Layer:
    return Layer(name, ConvProblem(hw, hw, c, k, f, f, stride, f // 2 if pad is None else pad, 1, n=n))


SUITES: dict[str, tuple[Layer, ...]] = {
    "cifar-resnet": (
        _layer("conv1", 256, 32, 3, 16),
        _layer("res1", 256, 32, 16, 16),
        _layer("res2-down", 256, 32, 16, 32, stride=2),
        _layer("res2", 256, 16, 32, 32),
        _layer("res3-down", 256, 16, 32, 64, stride=2),
        _layer("res3", 256, 8, 64, 64),
        _layer("shortcut", 256, 32, 16, 32, f=1, stride=2, pad=0),
    ),
    "cifar-vgg": (
        _layer("conv1", 256, 32, 3, 32),
        _layer("conv2", 256, 16, 32, 64),
        _layer("conv3", 256, 8, 64, 128),
        _layer("conv32", 256, 32, 32, 32),
    ),
    "resnet50": (
        _layer("conv1", 64, 224, 3, 64, f=7, stride=2, pad=3),
        _layer("l1-1x1a", 64, 56, 64, 64, f=1),
        _layer("l1-3x3", 64, 56, 64, 64),
        _layer("l1-1x1b", 64, 56, 64, 256, f=1),
        _layer("l1-1x1c", 64, 56, 256, 64, f=1),
        _layer("l2-3x3-down", 64, 56, 128, 128, stride=2),
        _layer("l2-3x3", 64, 28, 128, 128),
        _layer("l2-1x1", 64, 28, 128, 512, f=1),
        _layer("l3-3x3", 64, 14, 256, 256),
        _layer("l3-1x1", 64, 14, 1024, 256, f=1),
        _layer("l4-3x3", 64, 7, 512, 512),
        _layer("l4-1x1", 64, 7, 512, 2048, f=1),
    ),
}


def get_suite(name: str) -> tuple[Layer, ...]:
    try:
        return SUITES[name]
    except KeyError:
        raise ValueError(f"unknown suite {name!r}; built-in suites: {', '.join(SUITES)}") from None
