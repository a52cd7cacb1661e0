"""NumPy neural-network layers with explicit forward/backward, losses and model builders.

Nothing here knows about MPI: data parallelism lives in :mod:`npddp.ddp`.
"""

from .attention import CausalSelfAttention
from .builders import cnn, mlp, summary
from .conv import Conv2d
from .dropout import Dropout
from .embedding import Embedding
from .gelu import GELU
from .gpt import GPT, PRESETS, Block, gpt, gpt_num_parameters, gpt_preset
from .layers import Flatten, Linear, ReLU, Tanh
from .losses import CrossEntropyLoss, MSELoss
from .module import Module, Parameter, Sequential
from .norm import LayerNorm
from .pool import MaxPool2d

__all__ = [
    "Parameter", "Module", "Sequential",
    "Linear", "ReLU", "Tanh", "GELU", "Conv2d", "MaxPool2d", "Flatten", "Dropout",
    "Embedding", "LayerNorm", "CausalSelfAttention", "Block", "GPT",
    "CrossEntropyLoss", "MSELoss",
    "mlp", "cnn", "gpt", "gpt_preset", "gpt_num_parameters", "PRESETS", "summary",
]
