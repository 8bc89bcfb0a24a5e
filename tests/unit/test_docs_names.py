"""Every name the current docs tell admins and users to import or configure resolves, at
its own place: the ``from spawner… import …`` and ``import spawner…`` lines, every dotted
``spawner.…`` name (a module string such as the extension ``"spawner.monitor"``, or a
function such as ``spawner.checkpoint.on_preempt``), and every setting ``c.Class.trait``
or ``--Class.trait`` of the package's own classes, in docs/, the READMEs, the shipped
hub config and the deployment files. None is a name that moved (spawner/common/moved.py):
the docs name the new places, so they and the code cannot drift apart."""

from __future__ import annotations

import importlib
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
from traitlets.config import Configurable

from spawner.common import moved

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*ROOT.glob("docs/*.md"), ROOT / "README.md", ROOT / "images" / "README.md",
                  *ROOT.glob("hub_config/*.py"), *ROOT.glob("deploy/**/*.yaml"),
                  *ROOT.glob("deploy/**/Dockerfile*")])

FROM_IMPORT = re.compile(r"\bfrom (spawner(?:\.\w+)*) import \(?([\w, \t]+)")
IMPORT = re.compile(r"(?<![\w.])import (spawner(?:\.\w+)*)")
# a dotted name: not part of a longer word, a path (spawner/…), a label (quota-spawner.user)
DOTTED = re.compile(r"(?<![\w./-])spawner(?:\.\w+)+")
SETTING = re.compile(r"(?<![\w.])(?:c\.|--)([A-Z]\w+)\.(\w+)")
FILE_SUFFIXES = {"py", "json", "yaml", "yml", "md", "txt"}  # spawner.monitor.json: a file


def occurrences(pattern: re.Pattern[str]) -> dict[str, set[str]]:
    """Each match's text, with the files it is in."""
    found: dict[str, set[str]] = {}
    for path in SOURCES:
        for match in pattern.finditer(path.read_text(encoding="utf-8")):
            found.setdefault(match.group(0), set()).add(str(path.relative_to(ROOT)))
    return found


def resolve(dotted: str) -> Any:
    """The module, or the module's attribute, that ``dotted`` names."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for part in parts[i:]:
            found = getattr(found, part)
        return found
    raise ModuleNotFoundError(dotted)


def assert_at_its_place(dotted: str) -> Any:
    """``dotted`` resolves, to a name that never moved, and warns of no move."""
    moved_names = {f"{m}.{n}" for m, n in moved.NAMES} | set(moved.MODULES) | moved.PACKAGES
    assert not any(dotted == old or dotted.startswith(old + ".") for old in moved_names), \
        f"{dotted} is a name that moved (spawner/common/moved.py)"
    with warnings.catch_warnings():
        warnings.simplefilter("error", moved.QuotaSpawnerDeprecationWarning)
        return resolve(dotted)


IMPORTS = occurrences(FROM_IMPORT)
MODULE_IMPORTS = occurrences(IMPORT)
DOTTED_NAMES = {name: files for name, files in occurrences(DOTTED).items()
                if name.rsplit(".", 1)[1] not in FILE_SUFFIXES}
SETTINGS = occurrences(SETTING)


def test_the_docs_name_the_package_at_all():
    assert len(IMPORTS) >= 5 and len(DOTTED_NAMES) >= 20 and len(SETTINGS) >= 50


@pytest.mark.parametrize("line", sorted(IMPORTS))
def test_each_from_import_resolves_at_its_place(line):
    match = FROM_IMPORT.fullmatch(line)
    assert match is not None
    module, names = match.groups()
    for name in (n.split(" as ")[0].strip() for n in names.split(",")):
        if name:
            assert_at_its_place(f"{module}.{name}")


@pytest.mark.parametrize("line", sorted(MODULE_IMPORTS))
def test_each_module_import_resolves_at_its_place(line):
    assert_at_its_place(line.removeprefix("import "))


@pytest.mark.parametrize("name", sorted(DOTTED_NAMES))
def test_each_dotted_name_resolves_at_its_place(name):
    assert_at_its_place(name)


def our_configurables() -> dict[str, type[Configurable]]:
    """The traitlets classes of the package, by name (the settings' sections)."""
    import spawner.docker.spawner  # noqa: F401
    import spawner.kube.spawner  # noqa: F401
    import spawner.notebook.monitor.collector  # noqa: F401
    import spawner.watchdog.app  # noqa: F401
    import spawner.webapp.app  # noqa: F401

    found: dict[str, type[Configurable]] = {}
    todo: list[type] = [Configurable]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.__module__.split(".")[0] == "spawner":
            found[cls.__name__] = cls
    return found


def test_each_setting_of_ours_is_a_setting_of_that_class():
    ours = our_configurables()
    assert {"QuotaSpawner", "QuotaKubeSpawner", "QuotaWebApp", "QuotaWatchdog",
            "WatchdogRules", "Notifier", "GpuMonitor"} <= set(ours)
    wrong = []
    for text, files in sorted(SETTINGS.items()):
        match = SETTING.fullmatch(text)
        assert match is not None
        section, trait = match.groups()
        assert section not in moved.CONFIG_CLASSES, f"{text} ({files}): a class that moved"
        if section in ours and not ours[section].class_traits(config=True).get(trait):
            wrong.append(f"{text} in {sorted(files)}")
    assert not wrong, "settings the docs name that their class does not have: " + \
        "; ".join(wrong)
