"""The one Registry class: names in order, bad, taken and unknown names refused with the valid ones named."""

import pytest

from npddp.util.registry import Registry


def test_entries_come_back_by_name_in_registration_order():
    r = Registry("widget")
    for name, entry in [("b", 2), ("a", 1), ("c", 3)]:
        r.add(name, entry)
    assert r.names() == ("b", "a", "c") and list(r) == ["b", "a", "c"] and len(r) == 3
    assert [r.get(n) for n in r] == [2, 1, 3] and "a" in r and "z" not in r
    r.remove("a")
    assert r.names() == ("b", "c")
    r.add("b", 20, replace=True)
    assert r.get("b") == 20 and r.names() == ("b", "c")


@pytest.mark.parametrize("name, text", [("two words", "identifier"), ("", "''"), (3, "3"), ("auto", "other than 'auto'"),
                                        ("b", "'b' is already registered; taken: b")])
def test_a_bad_or_taken_name_is_refused_and_adds_nothing(name, text):
    r = Registry("widget", reserved=("auto",))
    r.add("b", 1)
    with pytest.raises(ValueError, match=text):
        r.add(name, 2)
    assert r.names() == ("b",) and r.get("b") == 1


def test_an_unknown_name_names_the_kind_and_the_valid_ones():
    r = Registry("gadget")
    r.add("x", 1)
    r.add("y", 2)
    with pytest.raises(ValueError, match=r"unknown gadget 'z'; valid: x, y"):
        r.get("z")
    with pytest.raises(ValueError, match=r"unknown gadget \[1\]"):
        r.get([1])
