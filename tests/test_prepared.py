"""convgen.prepare's argument checks, which run before any GPU is touched."""

from __future__ import annotations

import pytest

import convgen

pytest.importorskip("cupy", reason="convgen.prepare needs CuPy")


@pytest.mark.parametrize("kwargs,match", [
    (dict(pass_="fprop", x_shape=(2, 8, 8), w_shape=(4, 3, 3, 8)), r"x_shape must be a 4-tuple \(N, H, W, C\)"),
    (dict(pass_="fprop", x_shape=(2, 8, 8, 8), w_shape=(4, 3, 3, 5)), r"w_shape has 5 input channels"),
    (dict(pass_="dgrad", x_shape=(2, 8, 8, 8), w_shape=(4, 3, 3, 8), bias=True), "bias does not apply to dgrad"),
    (dict(pass_="wgrad", x_shape=(2, 8, 8, 8), w_shape=(4, 3, 3, 8), activation="relu"), "activation is an fprop"),
    (dict(pass_="fprop", x_shape=(2, 8, 8, 8), w_shape=(4, 3, 3, 8), activation="tanh"), "activation must be None, 'relu' or 'gelu'"),
    (dict(pass_="dgrad", x_shape=(2, 8, 8, 8), w_shape=(4, 3, 3, 8), residual=True), "residual is an fprop epilogue"),
    (dict(pass_="fprop", x_shape=(2, 8, 8, 8), w_shape=(4, 3, 3, 8), residual=1), "residual must be True or False"),
    (dict(pass_="fprop", x_shape=(2, 8, 8, 8), w_shape=(4, 3, 3, 8), alpha=2.0), "they need residual=True"),
    (dict(pass_="fprop", x_shape=(2, 8, 8, 8), w_shape=(4, 3, 3, 8), residual=True, beta=float("nan")),
     "beta must be a finite number"),
    (dict(pass_="fprop", x_shape=(2, 8, 8, 8), w_shape=(4, 3, 3, 8), in_dtype="int8"), "in_dtype must be float16, bfloat16 or float32"),
    (dict(pass_="sideways", x_shape=(2, 8, 8, 8), w_shape=(4, 3, 3, 8)), "pass must be one of fprop, dgrad, wgrad"),
    (dict(pass_="fprop", x_shape=(2, 8, 8, 8), w_shape=(4, 9, 9, 8)), "output height p would be <= 0"),
])
def test_prepare_names_the_bad_argument(kwargs, match):
    pass_ = kwargs.pop("pass_")
    with pytest.raises(ValueError, match=match):
        convgen.prepare(pass_, **kwargs)
