"""scripts/image_inputs.py: what the image build reads from pyproject.toml.

No Docker: each test writes a pyproject.toml under tmp_path.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "image_inputs.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("image_inputs", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


image_inputs = _load()

PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "demo"
version = "1.0"
dependencies = ["a>=1", "b"]

[project.optional-dependencies]
notebook = ["c==2"]
test = ["pytest"]

[tool.setuptools.packages.find]
include = ["demo*"]

[tool.ruff]
line-length = 100

[tool.pytest.ini_options]
testpaths = ["tests"]
"""

# The digest of PYPROJECT, as the inline Python that build-images.sh had
# before this script computed it. Images carry it (through their inputs hash) in
# their label: if this changes, every image built before counts as stale.
PYPROJECT_DIGEST = "efa412449eedf33ce91bcfef9b16bb805268efffabc7c26c898dc80bde8a50a1"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pyproject.toml"
    path.write_text(text)
    return path


def digest(tmp_path: Path, text: str) -> str:
    return image_inputs.pyproject_digest(image_inputs.load(write(tmp_path, text)))


def test_digest_is_stable(tmp_path: Path) -> None:
    assert digest(tmp_path, PYPROJECT) == PYPROJECT_DIGEST


@pytest.mark.parametrize(
    "old, new",
    [
        ("line-length = 100", "line-length = 120"),  # [tool.ruff]
        ('testpaths = ["tests"]', 'testpaths = ["other"]'),  # [tool.pytest]
        ("[tool.ruff]", "# a comment\n[tool.ruff]"),
    ],
)
def test_digest_ignores_what_does_not_shape_the_wheel(tmp_path: Path, old: str, new: str) -> None:
    assert old in PYPROJECT
    assert digest(tmp_path, PYPROJECT.replace(old, new)) == PYPROJECT_DIGEST


@pytest.mark.parametrize(
    "old, new",
    [
        ('"setuptools>=68"', '"setuptools>=69"'),  # [build-system]
        ('"a>=1", "b"', '"a>=1", "b", "d"'),  # [project] dependencies
        ('test = ["pytest"]', 'test = ["pytest", "x"]'),  # any extra
        ('include = ["demo*"]', 'include = ["other*"]'),  # [tool.setuptools.*]
    ],
)
def test_digest_follows_what_shapes_the_wheel(tmp_path: Path, old: str, new: str) -> None:
    assert old in PYPROJECT
    assert digest(tmp_path, PYPROJECT.replace(old, new)) != PYPROJECT_DIGEST


def test_digest_of_minimal_pyproject(tmp_path: Path) -> None:
    # Missing tables count as null, not as an error.
    assert image_inputs.wheel_tables({}) == {"build-system": None, "project": None, "tool": {}}
    assert len(digest(tmp_path, "")) == 64


def test_project_requirements(tmp_path: Path) -> None:
    pyproject = image_inputs.load(write(tmp_path, PYPROJECT))
    assert image_inputs.project_requirements(pyproject) == ["a>=1", "b", "c==2"]


@pytest.mark.parametrize(
    "text, want",
    [
        ('[project]\nname = "x"\n', []),
        ('[project]\nname = "x"\ndependencies = ["a"]\n', ["a"]),
        ('[project]\nname = "x"\n[project.optional-dependencies]\nnotebook = ["n"]\n', ["n"]),
    ],
)
def test_project_requirements_without_some_lists(
    tmp_path: Path, text: str, want: list[str]
) -> None:
    assert image_inputs.project_requirements(image_inputs.load(write(tmp_path, text))) == want


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, PYPROJECT)
    assert image_inputs.main(["pyproject-digest", str(path)]) == 0
    assert capsys.readouterr().out == PYPROJECT_DIGEST + "\n"
    assert image_inputs.main(["project-requirements", str(path)]) == 0
    assert capsys.readouterr().out == "a>=1\nb\nc==2\n"


def test_cli_reads_pyproject_in_working_directory(tmp_path: Path) -> None:
    # As build-images.sh calls it: from the repository root, no path.
    write(tmp_path, PYPROJECT)
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "pyproject-digest"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == PYPROJECT_DIGEST + "\n"


def test_cli_rejects_unknown_command(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        image_inputs.main(["nonsense", str(write(tmp_path, PYPROJECT))])
