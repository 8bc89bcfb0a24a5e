"""Fixtures of the end-to-end layer alone (the shared hubs are every layer's:
tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hookless_engine import Engine, hookless_engine


@pytest.fixture(scope="module")
def hookless() -> Iterator[Engine]:
    """A private dockerd with no NVIDIA hook on its PATH, and the tiny image as TINY
    (tests/e2e/hookless_engine.py); one for each module that asks."""
    yield from hookless_engine()
