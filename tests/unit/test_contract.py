"""The names that cross the container boundary, and how the container reads them back."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from spawner import contract
from spawner.contract import CONTRACT_ENV, LABEL_PREFIX, gpu_memory_limit, home_is_full

PACKAGE = Path(__file__).resolve().parents[2] / "spawner"


@pytest.mark.parametrize("value, expected", [
    (None, None), ("", None), ("0", None), ("-5", None), ("lots", None), ("1.5G", None),
    ("1", 1), (str(20 * 2**30), 20 * 2**30),
])
def test_gpu_memory_limit(value, expected):
    env = {} if value is None else {"GPU_MEMORY_LIMIT": value}
    assert gpu_memory_limit(env) == expected


MiB = 2**20


@pytest.mark.parametrize("used, limit, full", [
    (0, 64 * MiB, False),
    (63 * MiB, 64 * MiB, False),  # more than 1% of a small home left
    (64 * MiB - 655_360, 64 * MiB, True),  # within 1%
    (80 * MiB, 64 * MiB, True),  # over its size (a smaller role)
    (20 * 1024 * MiB - 5 * MiB, 20 * 1024 * MiB, False),
    (20 * 1024 * MiB - 3 * MiB, 20 * 1024 * MiB, True),  # btrfs stopped the write here
])
def test_a_home_is_full_a_little_before_its_size(used, limit, full):
    """The filesystem refuses a write a few MiB before the size, so a home filled by
    writes must read as full, or its user is never told."""
    assert home_is_full(used, limit) is full


def test_names_are_unique():
    labels = [v for k, v in vars(contract).items() if k.endswith("_LABEL")]
    assert len(labels) == len(set(labels)) and all(v.startswith(LABEL_PREFIX) for v in labels)
    assert len(CONTRACT_ENV) == len(set(CONTRACT_ENV))


def test_no_module_spells_a_contract_name_itself():
    """Every label and variable of the contract is named in spawner/contract.py only."""
    names = {v for k, v in vars(contract).items()
             if k.isupper() and isinstance(v, str) and k not in ("NO_GPU",)}
    names |= set(CONTRACT_ENV) | {contract.NO_GPU}
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "contract.py" or "labextension" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value in names:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value!r}")
    assert not found, "\n".join(found)


def test_contract_is_cheap_to_import():
    """The torch cap hook imports it at every Python start inside the images."""
    tree = ast.parse((PACKAGE / "contract.py").read_text())
    imported = {n.module.split(".")[0] for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                 for a in n.names}
    assert imported <= {"__future__", "collections"}, imported


def test_the_image_side_imports_stay_cheap():
    """What the images import at every Python start (the .pth line) and in every
    server (the monitor) pulls in nothing of the hub side."""
    code = (
        "import sys, json\n"
        "import spawner.notebook.torch_cap\n"
        "first = sorted(m for m in sys.modules if m.startswith('spawner'))\n"
        "import spawner.monitor, spawner.notebook.monitor.report, spawner.quota.units\n"
        "import spawner.checkpoint\n"
        "print(json.dumps([first, sorted(sys.modules)]))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, cwd=PACKAGE.parent)
    at_start, everything = json.loads(result.stdout)
    assert at_start == ["spawner", "spawner.contract", "spawner.notebook",
                        "spawner.notebook.torch_cap"]
    hub_side = {"docker", "dockerspawner", "jupyterhub", "yaml", "sqlalchemy", "spawner.docker",
                "spawner.docker.spawner", "spawner.docker.container", "spawner.quota.loader",
                "spawner.gpu.pool", "spawner.policy", "spawner.usage", "spawner.webapp"}
    assert not hub_side & set(everything)
