"""The model registry behind --model: every registered model builds the same weights every time,
dropout goes after each ReLU that feeds a Linear, and the descriptions name the widths."""

import numpy as np
import pytest

from npddp.train.models import MODELS, build_model, input_problem, shape_rows
from npddp.nn import Dropout, Linear, ReLU

SETTINGS = {"hidden": [8, 6], "channels": [2], "dtype": "float32", "seed": 3, "dropout": 0.0}
SHAPES = {"mlp": (3, 4, 4), "cnn": (1, 8, 8), "gpt": (6,)}   # gpt: a sequence of 6 tokens


@pytest.mark.parametrize("name", MODELS)
def test_every_model_builds_identical_weights_from_the_same_settings(name):
    a, _, text = build_model({**SETTINGS, "model": name}, SHAPES[name], 5)
    b, _, _ = build_model({**SETTINGS, "model": name}, SHAPES[name], 5)
    assert text.startswith(name) and all(np.array_equal(p.data, q.data) for p, q in zip(a.parameters(), b.parameters()))
    if name == "gpt":                                       # tokens in, (B, T, vocab) logits out
        X = np.random.default_rng(0).integers(0, 5, (2, *SHAPES[name]))
        assert a.forward(shape_rows(name, X)).shape == (2, 6, 5)
        return
    X = np.random.default_rng(0).standard_normal((2, *SHAPES[name])).astype(np.float32)
    assert a.forward(shape_rows(name, X)).shape == (2, 5)


def test_descriptions_name_the_layers():
    assert build_model({**SETTINGS, "model": "mlp"}, (3, 4, 4), 5)[2] == "mlp 48-8-6-5"
    assert build_model({**SETTINGS, "model": "cnn"}, (1, 8, 8), 5)[2] == "cnn (1, 8, 8), conv 2, dense 8-6-5"


def test_dropout_follows_each_relu_that_feeds_a_linear_with_a_stream_per_rank_and_layer():
    nets = [build_model({**SETTINGS, "model": "mlp", "dropout": 0.5}, (4,), 3, rank=r) for r in (0, 1)]
    net, dropouts, text = nets[0]
    kinds = [type(layer) for layer in net.layers]
    assert kinds == [Linear, ReLU, Dropout, Linear, ReLU, Dropout, Linear] and text.endswith(", dropout 0.5")
    assert len(dropouts) == 2
    states = [d.get_rng_state().tolist() for _, ds, _ in nets for d in ds]
    assert len({str(s) for s in states}) == 4                      # (rank, layer) each their own stream


def test_image_models_say_what_rows_they_need():
    assert input_problem("mlp", (3,)) is None and input_problem("cnn", (1, 8, 8)) is None
    assert "needs image rows (C, H, W)" in input_problem("cnn", (64,))
    with pytest.raises(ValueError, match="unknown model 'resnet'"):
        build_model({**SETTINGS, "model": "resnet"}, (3,), 2)
