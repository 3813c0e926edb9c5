"""convgen.conv2d / conv2d_dgrad / conv2d_wgrad name the argument at fault and what it accepts,
on a machine without a GPU: every argument is checked before any device is touched, so CuPy's
ndarray is stood in for by NumPy's here."""

from __future__ import annotations

import types

import numpy as np
import pytest

import convgen
from convgen import runtime


@pytest.fixture(autouse=True)
def numpy_as_cupy(monkeypatch):
    """runtime's `cupy.ndarray` is numpy.ndarray; reaching the device (past validation) raises Reached."""
    monkeypatch.setattr(runtime, "_cupy", lambda: types.SimpleNamespace(ndarray=np.ndarray))

    def reached(problem, *args):
        raise Reached(problem)

    monkeypatch.setattr(runtime, "_same_device", lambda **arrays: 0)
    monkeypatch.setattr(runtime, "_kernel", reached)
    monkeypatch.setattr(runtime, "_calls", {})


class Reached(Exception):
    """Validation passed: the call got as far as looking up its kernel."""


x = np.zeros((2, 8, 8, 16), np.float16)
w = np.zeros((16, 3, 3, 16), np.float16)
dy = np.zeros((2, 8, 8, 16), np.float16)


@pytest.mark.parametrize("out_dtype", ["nonsense", np.float64, "int8", object()])
def test_out_dtype_names_the_accepted_values(out_dtype):
    for call in (lambda: convgen.conv2d(x, w, padding=1, out_dtype=out_dtype),
                 lambda: convgen.conv2d_dgrad(dy, w, x.shape, padding=1, out_dtype=out_dtype),
                 lambda: convgen.conv2d_wgrad(x, dy, w.shape, padding=1, out_dtype=out_dtype)):
        with pytest.raises(ValueError, match=r"^out_dtype must be None, 'float16', 'bfloat16' or 'float32' .*, got "):
            call()


@pytest.mark.parametrize("out_dtype", ["float32", np.float16, np.dtype("float32"), None])  # None: the MMAs' type
def test_out_dtype_accepts_names_and_dtypes(out_dtype):
    with pytest.raises(Reached):
        convgen.conv2d(x, w, padding=1, out_dtype=out_dtype)


@pytest.mark.parametrize("shape, error, message", [
    ((2, 8, 8, "a"), TypeError, r"^input_shape \(N, H, W, C\): C must be an integer, got 'a' in \(2, 8, 8, 'a'\)"),
    ((2, 8.0, 8, 16), TypeError, r"^input_shape \(N, H, W, C\): H must be an integer, got 8\.0"),
    ((2, 8, True, 16), TypeError, r"W must be an integer, got True"),
    ((2, 8, 8), ValueError, r"^input_shape must be four integers \(N, H, W, C\), got 3: \(2, 8, 8\)"),
    (28816, TypeError, r"^input_shape must be a tuple of four integers \(N, H, W, C\), got int 28816"),
    ((-2, 8, 8, 16), ValueError, r"N must be >= 0, got -2"),
])
def test_input_shape_names_the_axis(shape, error, message):
    with pytest.raises(error, match=message):
        convgen.conv2d_dgrad(dy, w, shape, padding=1)


@pytest.mark.parametrize("shape, message", [
    ((16, 3.5, 3, 16), r"^weight_shape \(K, R, S, C\): R must be an integer, got 3\.5"),  # was truncated to 3
    ((16, 3, 3.0, 16), r"S must be an integer, got 3\.0"),
    (("16", 3, 3, 16), r"K must be an integer, got '16'"),
])
def test_weight_shape_rejects_non_integers(shape, message):
    with pytest.raises(TypeError, match=message):
        convgen.conv2d_wgrad(x, dy, shape, padding=1)


def test_numpy_integers_are_integers():
    with pytest.raises(Reached) as info:
        convgen.conv2d_dgrad(dy, w, (np.int64(2), np.int32(8), 8, np.uint8(16)), padding=1)
    assert info.value.args[0].x_shape == (2, 8, 8, 16)
    with pytest.raises(Reached) as info:
        convgen.conv2d_wgrad(x, dy, [np.int64(16), 3, 3, 16], padding=1)
    assert info.value.args[0].w_shape == (16, 3, 3, 16)


@pytest.mark.parametrize("call, message", [
    (lambda: convgen.conv2d(x, w[0]), r"^w must have 4 dimensions \(K, R, S, C\), got shape \(3, 3, 16\)"),
    (lambda: convgen.conv2d(x[0], w), r"^x must have 4 dimensions \(N, H, W, C\), got shape \(8, 8, 16\)"),
    (lambda: convgen.conv2d(x, w, np.zeros((16, 1), np.float32)), r"^bias must have 1 dimensions \(K,\)"),
    (lambda: convgen.conv2d_dgrad(dy[0], w, x.shape), r"^dy must have 4 dimensions \(N, P, Q, K\)"),
    (lambda: convgen.conv2d_wgrad(x, dy[0], w.shape), r"^dy must have 4 dimensions \(N, P, Q, K\)"),
])
def test_array_rank_names_the_layout(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("call, message", [
    (lambda: convgen.conv2d(x, w, padding=1, plan="fast"), r"^plan must be a convgen\.Plan or None, got str"),
    (lambda: convgen.conv2d(x, w, padding=1, scalar="yes"), r"^scalar must be True or False, got 'yes'"),
    (lambda: convgen.conv2d_dgrad(dy, w, x.shape, padding=1, plan=3), r"^plan must be a convgen\.Plan"),
    (lambda: convgen.conv2d_wgrad(x, dy, w.shape, padding=1, bias=np.zeros(16, np.float32)),
     r"^bias must be True or False \(whether to return db\), got ndarray"),
    (lambda: convgen.conv2d(x, w, padding=1.5), r"^padding must be an integer, got 1\.5"),
    (lambda: convgen.conv2d(x, w, stride=(1, 1, 1)), r"^stride must be an int or a \(height, width\) pair"),
    (lambda: convgen.conv2d(x, w, padding="full"), r"^padding must be an int, a pair, 'same' or 'valid', got 'full'"),
])
def test_options_name_the_argument(call, message):
    with pytest.raises((TypeError, ValueError), match=message):
        call()


def test_repeat_call_keys_are_hashed_once_and_a_list_option_means_full_checks():
    """The repeat path's key holds each array's type, shape, dtype and device and the call's
    options; a list among the options (stride=[1, 1]) cannot key a dict, so that call is
    checked in full every time rather than failing, and a hashable key finds its call."""
    class Arr:  # what the key reads of a CuPy array
        shape, dtype, data = (2, 8, 8, 16), np.dtype(np.float16), types.SimpleNamespace(device_id=0)

    call = object()
    listed = runtime._call_key("fprop", (Arr(), None), [1, 1], 1)
    assert runtime._known(listed) is None and runtime._remember(listed, call) is call and not runtime._calls
    key = runtime._call_key("fprop", (Arr(), None), (1, 1), 1)
    assert key == ("fprop", (Arr, (2, 8, 8, 16), "e", 0), None, (1, 1), 1)
    assert runtime._known(key) is None and runtime._remember(key, call) is call and runtime._known(key) is call
    assert runtime._call_key("fprop", (np.zeros(1), None)) is None  # not a CuPy array: no .data.device_id
