"""Module.state_dict / load_state_dict: copies by name, strict checks naming every bad entry, in place."""

import numpy as np
import pytest

from npddp.nn import cnn, mlp


@pytest.mark.parametrize("build", [lambda s: mlp(5, [7, 3], 4, seed=s, dtype=np.float64),
                                   lambda s: cnn((1, 8, 8), [2], [6], 3, seed=s)])
def test_a_state_dict_round_trips_into_another_model_in_place(build):
    a, b = build(0), build(1)
    state = a.state_dict()
    assert list(state) == [n for n, _ in a.named_parameters()]
    state[next(iter(state))][...] = 0                       # a copy: the model is untouched
    assert not np.all(a.parameters()[0].data == 0)
    arrays = [p.data for p in b.parameters()]
    assert b.load_state_dict(a.state_dict()) == ([], [])
    assert all(x is p.data for x, p in zip(arrays, b.parameters()))     # loaded in place
    assert all(np.array_equal(p.data, q.data) for p, q in zip(a.parameters(), b.parameters()))


def test_strict_loading_names_missing_unexpected_and_misshaped_entries_and_changes_nothing():
    model = mlp(5, [7], 4, seed=0)
    before = model.state_dict()
    state = model.state_dict()
    del state["0.bias"]
    state["9.weight"] = np.zeros(3)
    state["2.weight"] = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError) as info:
        model.load_state_dict(state)
    text = str(info.value)
    assert "missing ['0.bias']" in text and "unexpected ['9.weight']" in text
    assert "2.weight: (4, 8) float32 given, (4, 7) float32 expected" in text
    assert all(np.array_equal(before[k], v) for k, v in model.state_dict().items())


def test_non_strict_loading_takes_what_fits_and_reports_the_rest():
    model = mlp(5, [7], 4, seed=0)
    state = {"0.weight": np.ones((7, 5), np.float32), "extra": np.ones(2)}
    assert model.load_state_dict(state, strict=False) == (["0.bias", "2.weight", "2.bias"], ["extra"])
    assert np.all(model.state_dict()["0.weight"] == 1)
    with pytest.raises(ValueError, match="mis-shaped"):
        model.load_state_dict({"0.weight": np.ones((5, 7))}, strict=False)
