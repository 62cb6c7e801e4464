"""The order the suite hands xdist: long tests dealt out first, slices of the sizes xdist cuts."""

from __future__ import annotations

from types import SimpleNamespace

from medallion_assets_tests.support.timing import LONG_TEST_SECONDS, balanced_order


def _items(names):
    return [SimpleNamespace(nodeid=name) for name in names]


def test_long_tests_head_the_slices_and_each_slice_keeps_the_size_xdist_cuts():
    items = _items([f"quick{i}" for i in range(7)] + ["long_a", "long_b", "long_c"])
    seconds = {"long_a": 1300.0, "long_b": 500.0, "long_c": 400.0, "quick0": LONG_TEST_SECONDS}
    order = [item.nodeid for item in balanced_order(items, 2, seconds)]

    assert sorted(order) == sorted(item.nodeid for item in items)  # nothing lost or repeated
    first, second = order[:5], order[5:]  # xdist's worksteal: len // 2 to the first worker, the rest to the second
    assert first[0] == "long_a"
    assert second[:2] == ["long_b", "long_c"]  # the other worker carries the next longest, 900 s against 1300 s
    # The short tests keep their collection order behind the long ones.
    assert [n for n in order if n.startswith("quick")] == [f"quick{i}" for i in range(7)]


def test_without_recorded_durations_the_collection_order_stands():
    items = _items(["a", "b", "c", "d", "e"])
    assert [item.nodeid for item in balanced_order(items, 2, {})] == ["a", "b", "c", "d", "e"]
