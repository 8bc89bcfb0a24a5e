"""What scripts/build-images.sh reads from pyproject.toml.

    python3 scripts/image_inputs.py pyproject-digest [PYPROJECT]
        sha256 (hex) of the tables that shape the quota-spawner wheel:
        [build-system], [project] and [tool.setuptools*]. It stands for
        pyproject.toml in the images' input hash, so editing [tool.ruff] or
        [tool.pytest] rebuilds nothing.

    python3 scripts/image_inputs.py project-requirements [PYPROJECT]
        quota-spawner's own requirements, one a line: [project] dependencies,
        then the `notebook` extra. The image installs them in its cached deps
        layer, and the package itself later with --no-deps.

PYPROJECT defaults to ./pyproject.toml. Needs Python 3.11+ (tomllib); the
script runs it with Debian's /usr/bin/python3. The digest must stay the same
for the same file: the images built before carry it in their label.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomllib

WHEEL_TABLES = ("build-system", "project")


def load(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        return tomllib.load(f)


def wheel_tables(pyproject: dict[str, Any]) -> dict[str, Any]:
    """The parts of pyproject.toml that can change the built wheel."""
    keep: dict[str, Any] = {k: pyproject.get(k) for k in WHEEL_TABLES}
    keep["tool"] = {
        k: v for k, v in pyproject.get("tool", {}).items() if k.startswith("setuptools")
    }
    return keep


def pyproject_digest(pyproject: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(wheel_tables(pyproject), sort_keys=True).encode()).hexdigest()


def project_requirements(pyproject: dict[str, Any]) -> list[str]:
    project = pyproject["project"]
    extra: list[str] = project.get("optional-dependencies", {}).get("notebook", [])
    return list(project.get("dependencies", [])) + list(extra)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="image_inputs.py", description="What the image build reads from pyproject.toml."
    )
    parser.add_argument("command", choices=("pyproject-digest", "project-requirements"))
    parser.add_argument("pyproject", nargs="?", type=Path, default=Path("pyproject.toml"))
    args = parser.parse_args(argv)
    pyproject = load(args.pyproject)
    if args.command == "pyproject-digest":
        print(pyproject_digest(pyproject))
    else:
        print("\n".join(project_requirements(pyproject)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
