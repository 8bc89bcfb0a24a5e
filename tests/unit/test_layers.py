"""Every module of spawner/ is in a layer of the architecture's contract (pyproject.toml
[tool.importlinter]; docs/architecture.md#the-layers): the layers name each module and
package at the root, and the contract is exhaustive, so ``lint-imports`` also fails on a
new one that no layer names. The root holds only the entry points."""

from __future__ import annotations

import pkgutil
from pathlib import Path

import tomllib

import spawner

ROOT = Path(__file__).resolve().parents[2]


def layers_contract() -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (found,) = [c for c in config["contracts"] if c["type"] == "layers"]
    return found


def test_every_module_at_the_root_is_in_a_layer_and_the_contract_says_so():
    contract = layers_contract()
    assert contract["containers"] == ["spawner"] and contract["exhaustive"] is True
    named = {name.strip() for layer in contract["layers"] for name in layer.split("|")}
    at_root = {m.name for m in pkgutil.iter_modules(spawner.__path__)}
    assert at_root - named == set(), "modules of spawner/ outside every layer"
    assert named - at_root == set(), "layers that name no module"


def test_the_root_holds_only_the_entry_points():
    modules = {m.name for m in pkgutil.iter_modules(spawner.__path__) if not m.ispkg}
    assert modules == {"cli", "contract"}
