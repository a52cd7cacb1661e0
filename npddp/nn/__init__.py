"""NumPy neural-network layers with explicit forward/backward, losses and model builders.

Nothing here knows about MPI: data parallelism lives in :mod:`npddp.parallel.ddp`.
"""

from npddp.nn.attention import CausalSelfAttention
from npddp.nn.builders import cnn, mlp, summary
from npddp.nn.conv import Conv2d
from npddp.nn.dropout import Dropout
from npddp.nn.embedding import Embedding
from npddp.nn.gelu import GELU
from npddp.nn.gpt import GPT, PRESETS, Block, gpt, gpt_num_parameters, gpt_preset
from npddp.nn.layers import Flatten, Linear, ReLU, Tanh
from npddp.nn.losses import CrossEntropyLoss, MSELoss
from npddp.nn.module import Module, Sequential
from npddp.nn.parameter import Parameter, settle_grads
from npddp.nn.moe import MoE
from npddp.nn.norm import LayerNorm
from npddp.nn.pool import MaxPool2d

__all__ = [
    "Parameter", "Module", "Sequential", "settle_grads",
    "Linear", "ReLU", "Tanh", "GELU", "Conv2d", "MaxPool2d", "Flatten", "Dropout",
    "Embedding", "LayerNorm", "CausalSelfAttention", "Block", "GPT",
    "MoE", "CrossEntropyLoss", "MSELoss",
    "mlp", "cnn", "gpt", "gpt_preset", "gpt_num_parameters", "PRESETS", "summary",
]
