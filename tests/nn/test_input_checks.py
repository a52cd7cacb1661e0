"""Every layer rejects a wrong input shape or dtype with an error naming it and what it expects."""

import re

import numpy as np
import pytest

from npddp.nn import Conv2d, Dropout, Flatten, Linear, MaxPool2d, ReLU, Tanh, cnn

F32 = np.float32

CASES = [  # (layer, bad input, error type, expected text)
    (Linear(784, 128), np.zeros((32, 100), F32), ValueError,
     "Linear(784->128): expected input of shape (..., 784) and dtype float32, got (32, 100) float32"),
    (Linear(784, 128), np.zeros((32, 784), np.float64), TypeError,
     "Linear(784->128): expected input of shape (..., 784) and dtype float32, got (32, 784) float64"),
    (Linear(4, 2), np.zeros((2, 4, 3), F32), ValueError, "expected input of shape (..., 4)"),
    (Linear(4, 2, dtype=np.float64), np.zeros((2, 4), F32), TypeError, "dtype float64"),
    (Linear(4, 2), np.zeros((2, 4), np.int32), TypeError, "got (2, 4) int32"),
    (Conv2d(3, 8, 3), np.zeros((2, 1, 8, 8), F32), ValueError,
     "Conv2d(3->8, kernel=(3, 3)): expected input of shape (B, 3, H, W) and dtype float32, got (2, 1, 8, 8) float32"),
    (Conv2d(3, 8, 3), np.zeros((3, 8, 8), F32), ValueError, "(B, 3, H, W)"),
    (Conv2d(3, 8, 3), np.zeros((2, 3, 8, 8), np.float64), TypeError, "dtype float32, got (2, 3, 8, 8) float64"),
    (Conv2d(3, 8, 5), np.zeros((2, 3, 4, 8), F32), ValueError, "smaller than the kernel"),
    (MaxPool2d(2), np.zeros((2, 8, 8), F32), ValueError,
     "MaxPool2d(kernel_size=(2, 2), stride=(2, 2)): expected input of shape (B, C, H, W)"),
    (MaxPool2d(2), np.zeros((2, 3, 8, 8), np.int64), TypeError, "floating dtype, got (2, 3, 8, 8) int64"),
    (MaxPool2d(3), np.zeros((2, 3, 2, 8), F32), ValueError, "H >= 3"),
    (ReLU(), np.zeros((2, 3), np.int32), TypeError, "ReLU(): expected input of shape (B, ...) and a floating dtype"),
    (ReLU(), np.float32(1.0), TypeError, "ReLU(): expected a numpy.ndarray"),
    (Tanh(), np.zeros(()), ValueError, "Tanh(): expected input with at least 1 dimensions"),
    (Tanh(), np.zeros(3, bool), TypeError, "Tanh(): expected input of shape (B, ...)"),
    (Flatten(), np.zeros(5, F32), ValueError, "Flatten(): expected input with at least 2 dimensions (B, ...)"),
    (Dropout(0.5), np.zeros((2, 2), np.int8), TypeError, "Dropout(p=0.5, seed=0)"),
    (Linear(3, 2), [[1.0, 2.0, 3.0]], TypeError, "Linear(3->2): expected a numpy.ndarray, got list"),
]


@pytest.mark.parametrize("layer,x,error,text", CASES, ids=[f"{i}-{type(c[0]).__name__}" for i, c in enumerate(CASES)])
def test_bad_input_names_layer_and_expected_shape(layer, x, error, text):
    with pytest.raises(error, match=re.escape(text)):
        layer.forward(x)


def test_every_public_layer_type_is_covered():
    covered = {type(c[0]) for c in CASES}
    assert covered == {Linear, Conv2d, MaxPool2d, ReLU, Tanh, Flatten, Dropout}


def test_model_error_points_at_the_first_layer():
    model = cnn((1, 28, 28), (4,), (8,), 10)
    text = "Conv2d(1->4, kernel=(3, 3), padding=(1, 1)): expected input of shape (B, 1, H, W)"
    with pytest.raises(ValueError, match=re.escape(text)):
        model.forward(np.zeros((2, 28, 28), F32))


def test_good_input_passes_every_check():
    x = np.zeros((2, 3, 8, 8), F32)
    for layer in (Conv2d(3, 4, 3), MaxPool2d(2), ReLU(), Tanh(), Dropout(0.1), Flatten()):
        layer.forward(x)
    Linear(5, 2).forward(np.zeros((7, 5), F32))
