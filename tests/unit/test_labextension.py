"""The prebuilt JupyterLab extension in spawner/labextension/ (docs/jupyterlab-status-bar.md).

No Docker, no node: these only read files. They fail when the sources in
labextension/ changed without a rebuild (``make labextension``), when the
committed build is incomplete, or when pyproject.toml would not install all
of it.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIR = ROOT / "labextension"
BUILD_DIR = ROOT / "spawner" / "labextension"
NAME = "@quota-spawner/gpu-status"
INSTALL_PREFIX = f"share/jupyter/labextensions/{NAME}"


def load_stamp_module():
    spec = importlib.util.spec_from_file_location("labextension_stamp", SOURCE_DIR / "stamp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


stamp = load_stamp_module()


def built_package() -> dict:
    return json.loads((BUILD_DIR / "package.json").read_text(encoding="utf-8"))


def test_sources_exist():
    for name in stamp.SOURCE_FILES:
        assert (SOURCE_DIR / name).is_file(), name
    files = {p.relative_to(SOURCE_DIR).as_posix() for p in stamp.source_files()}
    assert {"src/index.ts", "style/index.css"} <= files


def test_build_stamp_matches_sources():
    committed = stamp.read_stamp()
    hashes = stamp.source_hashes()
    changed = sorted(p for p in set(committed["sources"]) | set(hashes)
                     if committed["sources"].get(p) != hashes.get(p))
    assert committed["sources_sha256"] == stamp.sources_digest(hashes), (
        f"labextension/ changed since spawner/labextension/ was built ({', '.join(changed)}): "
        "run `make labextension` and commit spawner/labextension/")
    assert committed["package"] == NAME


def test_build_files_match_stamp():
    """Every built file is the one stamped: none missing, none extra, none edited."""
    assert stamp.read_stamp()["build"] == stamp.build_hashes(), (
        "spawner/labextension/ differs from its build-stamp.json: run `make labextension`")
    assert stamp.stale_reasons() == []


def test_built_package_json():
    package = built_package()
    assert package["name"] == NAME
    build = package["jupyterlab"]["_build"]
    load = BUILD_DIR / build["load"]
    assert build["load"].startswith("static/remoteEntry.")
    assert load.is_file(), f"{build['load']} named in jupyterlab._build.load is missing"
    assert build["extension"] == "./extension"
    assert build.get("style") == "./style"
    # the build's copy of the source package.json, plus _build
    source = json.loads((SOURCE_DIR / "package.json").read_text(encoding="utf-8"))
    del package["jupyterlab"]["_build"]
    assert package == source


def test_install_json_names_the_python_package():
    install = json.loads((BUILD_DIR / "install.json").read_text(encoding="utf-8"))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert install["packageManager"] == "python"
    assert install["packageName"] == project["name"]


def test_data_files_install_every_built_file():
    """pyproject's data-files put each file of spawner/labextension at its place under
    share/jupyter/labextensions/@quota-spawner/gpu-status, and nothing else there."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    data_files = pyproject["tool"]["setuptools"]["data-files"]
    installed = {}  # install path -> source path, both relative
    for dest, patterns in data_files.items():
        if not (dest == INSTALL_PREFIX or dest.startswith(INSTALL_PREFIX + "/")):
            continue
        for pattern in patterns:
            matches = [p for p in ROOT.glob(pattern) if p.is_file()]
            assert matches, f"data-files pattern {pattern!r} matches no file"
            for path in matches:
                installed[f"{dest}/{path.name}"] = path.relative_to(ROOT).as_posix()
    expected = {
        f"{INSTALL_PREFIX}/{p.relative_to(BUILD_DIR).as_posix()}": p.relative_to(ROOT).as_posix()
        for p in BUILD_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    }
    assert installed == expected


def test_item_writes_no_html():
    """Server data goes into the DOM as text only."""
    for path in (SOURCE_DIR / "src").glob("*.ts"):
        text = path.read_text(encoding="utf-8")
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write"):
            assert sink not in text, f"{path.name} uses {sink}"
    built = (BUILD_DIR / "static").glob("*.js")
    assert any("api/gpu/metrics" in p.read_text(encoding="utf-8") for p in built)


def test_build_has_the_early_launcher():
    """The second plugin (labextension/src/launcher.ts) is in the build, with the checks
    that keep it from opening a launcher over a document (tests/browser/test_browser_lab_start.py
    runs it)."""
    built = "".join(p.read_text(encoding="utf-8") for p in (BUILD_DIR / "static").glob("*.js"))
    for needle in (f"{NAME}:early-launcher", "launcher:create", "treePath", "isEmpty"):
        assert needle in built, needle
    source = (SOURCE_DIR / "src" / "index.ts").read_text(encoding="utf-8")
    assert "export default [plugin, earlyLauncher];" in source
