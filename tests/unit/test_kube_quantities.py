"""spawner/kube/quantities.py: limits compared by value, as a configuration writes them."""

from __future__ import annotations

import pytest
from kube_shapes import G

from spawner.kube.quantities import same_quantity


@pytest.mark.parametrize(("a", "b", "same"), [
    ("8", 8.0, True), ("500m", 0.5, True), ("8000m", "8", True), ("2Gi", 2 * G, True),
    ("1e3", "1k", True), ("1G", 10**9, True), (".5", "500m", True),
    ("8", "9", False), ("2G", 2 * G, False), (True, 1, False), ("", "0", False),
    ("lots", "lots", True), ("lots", "8", False), (None, None, True),
])
def test_same_quantity(a, b, same):
    assert same_quantity(a, b) is same
