"""NumPy neural-network layers with explicit forward/backward, losses and model builders.

Nothing here knows about MPI: data parallelism lives in :mod:`npddp.ddp`.
"""

from .builders import cnn, mlp, summary
from .conv import Conv2d
from .dropout import Dropout
from .layers import Flatten, Linear, ReLU, Tanh
from .losses import CrossEntropyLoss, MSELoss
from .module import Module, Parameter, Sequential
from .pool import MaxPool2d

__all__ = [
    "Parameter", "Module", "Sequential",
    "Linear", "ReLU", "Tanh", "Conv2d", "MaxPool2d", "Flatten", "Dropout",
    "CrossEntropyLoss", "MSELoss",
    "mlp", "cnn", "summary",
]
