"""Placeholder, filled in by this branch: the page's routes for make_app."""

from __future__ import annotations

from typing import Any


def routes(prefix: str) -> list[tuple[Any, ...]]:
    return []
