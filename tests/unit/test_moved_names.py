"""Names that moved (spawner/common/moved.py): each old module, name and config section the
docs ever told admins to use still works through 0.2.x, is the object at its new place,
and warns with a DeprecationWarning that names that place; the documented aliases
(spawner.checkpoint, spawner.monitor) work without a warning. The e2e side is
tests/e2e/test_e2e_old_config.py (a hub started from a config of the old docs)."""

from __future__ import annotations

import importlib
import importlib.resources
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import spawner
from spawner.common import moved
from spawner.common.moved import (
    CONFIG_CLASSES,
    MODULES,
    NAMES,
    PACKAGES,
    QuotaSpawnerDeprecationWarning,
)

ROOT = Path(__file__).resolve().parents[2]


def forget(name: str) -> None:
    """Import ``name`` afresh next time: out of sys.modules and its parent's attributes."""
    sys.modules.pop(name, None)
    parent, _, child = name.rpartition(".")
    if parent in sys.modules and child in vars(sys.modules[parent]):
        delattr(sys.modules[parent], child)


@pytest.mark.parametrize("old", sorted(MODULES))
def test_an_old_module_is_the_new_one_and_warns_naming_it(old):
    new = MODULES[old]
    forget(old)
    try:
        with pytest.warns(DeprecationWarning, match=rf"{old} is deprecated .*: use {new}$"):
            found = importlib.import_module(old)
        assert found is importlib.import_module(new)
        assert found.__spec__.name == new  # its own spec: its data files, its modules
    finally:
        forget(old)


@pytest.mark.parametrize("old", sorted(PACKAGES))
def test_an_old_package_holds_its_moved_modules(old):
    children = [m for m in MODULES if m.startswith(old + ".")]
    assert children
    forget(old)
    try:
        package = importlib.import_module(old)
        assert package.__path__ == []  # nothing of it is found on disk by another name
        with pytest.warns(DeprecationWarning, match=MODULES[children[0]]):
            importlib.import_module(children[0])
    finally:
        for name in [old, *children]:
            forget(name)


@pytest.mark.parametrize(("module", "name"), sorted(NAMES))
def test_an_old_name_is_the_new_object_and_warns_naming_it(module, name):
    where, new = NAMES[(module, name)]
    with pytest.warns(DeprecationWarning, match=rf"{module}\.{name} is deprecated .*: use "
                                                 rf"{where}\.{new}$"):
        found = getattr(importlib.import_module(module), name)
    assert found is getattr(importlib.import_module(where), new)


def test_a_from_import_of_an_old_name_warns_at_the_importing_line():
    code = compile("from spawner.webapp.app import usage_service\n", "/srv/my_config.py",
                   "exec")
    with pytest.warns(DeprecationWarning) as caught:
        exec(code, {})
    assert [(w.filename, w.lineno) for w in caught] == [("/srv/my_config.py", 1)]


def test_an_old_module_warns_at_the_line_of_the_config_that_imports_it():
    forget("spawner.culling")
    code = compile("x = 1\nfrom spawner.culling import culler_service\n", "/srv/my_config.py",
                   "exec")
    try:
        with pytest.warns(DeprecationWarning) as caught:
            exec(code, {})
    finally:
        forget("spawner.culling")
    assert [(w.filename, w.lineno) for w in caught] == [("/srv/my_config.py", 2)]


def test_other_names_fail_as_they_would_without_the_table():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("spawner.no_such_module")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("spawner.usage.no_such_module")
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = spawner.quota.nothing  # type: ignore[attr-defined]
    with pytest.raises(ImportError):
        exec("from spawner.webapp.app import nothing_here", {})


@pytest.mark.parametrize(("old", "new"), sorted(CONFIG_CLASSES.items()))
def test_an_old_config_section_still_sets_the_new_class_and_warns(old, new, tmp_path):
    from traitlets.config import Config

    from spawner.webapp import app

    cls = getattr(app, new)
    config = Config()
    config[old].events_file = "/var/log/hub.jsonl"
    with pytest.warns(DeprecationWarning, match=rf"{old} .* is deprecated .*: use {new}"):
        assert cls(config=config).events_file == "/var/log/hub.jsonl"
    config[new].events_file = "/var/log/new.jsonl"  # the new section wins
    with pytest.warns(DeprecationWarning):
        assert cls(config=config).events_file == "/var/log/new.jsonl"
    on_the_command_line = cls()
    with pytest.warns(DeprecationWarning, match=old):
        on_the_command_line.parse_command_line([f"--{old}.state_dir={tmp_path}"])
    assert on_the_command_line.state_dir == str(tmp_path)


def test_the_new_names_warn_nothing():
    from traitlets.config import Config

    from spawner.webapp.app import QuotaWebApp, webapp_service  # noqa: F401

    config = Config()
    config.QuotaWebApp.events_file = "/var/log/hub.jsonl"
    with warnings.catch_warnings():
        warnings.simplefilter("error", QuotaSpawnerDeprecationWarning)
        assert QuotaWebApp(config=config).events_file == "/var/log/hub.jsonl"
        for new in MODULES.values():
            importlib.import_module(new)


@pytest.mark.parametrize(("alias", "target"), sorted(spawner.ALIASES.items()))
def test_the_documented_aliases_are_their_modules_and_warn_nothing(alias, target):
    code = (f"import json, importlib, importlib.resources, {alias}, {target}\n"
            f"a, t = {alias}, {target}\n"
            f"print(json.dumps([a is t, a.__spec__.name, a.__name__]))\n")
    result = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code],
                            capture_output=True, text=True, check=True, cwd=ROOT)
    assert json.loads(result.stdout) == [True, target, target]


def test_the_monitor_alias_reads_its_data_files():
    """jupyter_server loads ``spawner.monitor``; its page is a data file of the package."""
    monitor = importlib.import_module("spawner.monitor")
    page = importlib.resources.files(monitor.__spec__.name).joinpath("static/gpu.html")
    assert page.read_text(encoding="utf-8").startswith("<!")


def test_the_table_imports_nothing_of_the_package():
    """spawner/__init__.py loads it only for an old name; it must cost the images nothing."""
    source = Path(moved.__file__).read_text()
    assert "from spawner" not in source and "import spawner" not in source
