"""What the package takes from JupyterHub, DockerSpawner and KubeSpawner: public names
only, but for the few private ones listed in docs/architecture.md (what we rely on in our
dependencies), each with its dependency pinned to the releases tested and a guard here
(or beside the code that uses it) that fails when a release moves it.

The scan reads spawner/'s source: a private name (``_x``) of those packages imported,
read from ``super()``, read or named in a string (``getattr``) where spawner/ defines no
such name itself, and, on the classes that extend theirs, a method overridden or an
instance attribute set under one of their private names.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import importlib.util
import inspect
import pkgutil
import re
import textwrap
from collections.abc import Iterator
from functools import cache
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version
from traitlets import HasTraits
from traitlets.config import Config

import spawner
from spawner import QuotaSpawner
from spawner.docker.config import filled_templates

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "spawner"
DEPENDENCIES = {"jupyterhub": "jupyterhub", "dockerspawner": "dockerspawner",
                "kubespawner": "jupyterhub-kubespawner"}  # import name: distribution

# The private names spawner/ still uses, where no public API does the same, and whose
# they are. docs/architecture.md#what-we-rely-on-in-our-dependencies says why, each.
RELIED_ON = {
    "_start_future": "jupyterhub",
    "_make_create_pod_request": "kubespawner",
    "_start_watching_pods": "kubespawner",
}


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name != "_"


def _defined(tree: ast.AST, everywhere: bool) -> Iterator[str]:
    """The names a module defines: functions, classes, attributes set (``self._x = …``),
    and its own or its classes' variables (``everywhere``: any variable, arguments too)."""

    def walk(node: ast.AST, top: bool) -> Iterator[str]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield child.name
            elif isinstance(child, ast.Attribute) and not isinstance(child.ctx, ast.Load):
                yield child.attr
            elif isinstance(child, ast.Name) and not isinstance(child.ctx, ast.Load) and \
                    (top or everywhere):
                yield child.id
            elif isinstance(child, ast.arg) and everywhere:
                yield child.arg
            elif isinstance(child, ast.alias) and (top or everywhere):
                yield child.asname or child.name.split(".")[0]
            # a function's variables are its own; a class's are the class's
            in_function = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                             ast.Lambda))
            yield from walk(child, top and not in_function)

    yield from walk(tree, True)


def _sources(root: Path) -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(root.rglob("*.py")):
        if "tests" not in path.relative_to(root).parts:
            yield path, ast.parse(path.read_text(encoding="utf-8"), str(path))


@cache
def dependency_names() -> dict[str, frozenset[str]]:
    """Each installed dependency's private names (its tests left out)."""
    found = {}
    for package in DEPENDENCIES:
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            continue  # kubespawner: the kubernetes extra is not installed
        names = {n for _, tree in _sources(Path(spec.origin).parent)
                 for n in _defined(tree, everywhere=False)}
        found[package] = frozenset(n for n in names if is_private(n))
    return found


def owners(name: str) -> list[str]:
    return [package for package, names in dependency_names().items() if name in names]


def _is_super(node: ast.expr) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "super")


def source_uses(package: Path = PACKAGE) -> list[tuple[str, str]]:
    """(name, where) of each private dependency name the package's source uses."""
    trees = list(_sources(package))
    ours = {n for _, tree in trees for n in _defined(tree, everywhere=True)}
    uses = []
    for path, tree in trees:
        where = path.relative_to(package.parent)
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.split(".")[0] in DEPENDENCIES:
                names = [p for p in node.module.split(".") if is_private(p)]
                names += [a.name for a in node.names if is_private(a.name)]
            elif isinstance(node, ast.Import):
                names = [p for a in node.names if a.name.split(".")[0] in DEPENDENCIES
                         for p in a.name.split(".") if is_private(p)]
            elif isinstance(node, ast.Attribute) and is_private(node.attr) and \
                    owners(node.attr) and (_is_super(node.value) or node.attr not in ours):
                names = [node.attr]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    node.value.isidentifier() and is_private(node.value) and \
                    owners(node.value) and node.value not in ours:
                names = [node.value]
            uses += [(name, f"{where}:{node.lineno}") for name in names]
    return uses


# what the traitlets metaclass writes on every class it makes
TRAITLETS_OWN = set(vars(type("Plain", (HasTraits,), {})))


def _self_attributes(cls: type) -> set[str]:
    """The instance attributes a class's own methods set (``self.x = …``)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return set()
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and not isinstance(n.ctx, ast.Load) and isinstance(n.value, ast.Name)
            and n.value.id == "self"}


def _ours(cls: type) -> bool:
    return cls.__module__ == "spawner" or cls.__module__.startswith("spawner.")


def class_uses() -> list[tuple[str, str]]:
    """(name, where) of each private name of a dependency's class that a class of
    spawner/ extending it overrides, or sets as its own instance attribute."""
    uses = set()
    for module in pkgutil.walk_packages(spawner.__path__, "spawner."):
        if module.name.endswith("__main__"):
            continue
        try:
            loaded = importlib.import_module(module.name)
        except Exception:  # a hub config fragment, or an extra not installed
            continue
        for cls in vars(loaded).values():
            if not (isinstance(cls, type) and cls.__module__ == module.name):
                continue
            theirs = [c for c in cls.__mro__
                      if c.__module__.split(".")[0] in DEPENDENCIES]
            if not theirs:
                continue
            their_names = {n for c in theirs for n in [*vars(c), *_self_attributes(c)]}
            for mine in filter(_ours, cls.__mro__):
                for name in {*vars(mine), *_self_attributes(mine)} - TRAITLETS_OWN:
                    if is_private(name) and name in their_names:
                        uses.add((name, f"{mine.__module__}.{mine.__qualname__}.{name}"))
    return sorted(uses)


def test_no_private_name_of_jupyterhub_or_the_spawners_but_those_relied_on():
    found = source_uses() + class_uses()
    unlisted = sorted({f"{name} ({', '.join(owners(name))}) at {where}"
                       for name, where in found if name not in RELIED_ON})
    assert unlisted == [], (
        "A private name of JupyterHub, DockerSpawner or KubeSpawner: use a public API, or "
        "add it to RELIED_ON and docs/architecture.md with a guard and the pin:\n  "
        + "\n  ".join(unlisted))
    # the list holds nothing that is no longer used, where its package is installed
    used = {name for name, _ in found}
    installed = {name for name, package in RELIED_ON.items()
                 if package in dependency_names()}
    assert installed <= used, installed - used
    for name, package in RELIED_ON.items():
        if package in dependency_names():
            assert package in owners(name), (name, package)


def test_the_scan_finds_each_kind_of_use(tmp_path):
    """The scan's rules on a module written for it: an import, a super() call, a read
    and a getattr string of a dependency's private name; its own names pass."""
    fake = tmp_path / "spawner"
    fake.mkdir()
    (fake / "bad.py").write_text(textwrap.dedent("""\
        from dockerspawner.dockerspawner import _deep_merge
        import jupyterhub._data

        class S:
            def __init__(self):
                self._own = 1

            async def start(self):
                await super()._start()
                return self._log_name, getattr(self, "_hub_auth_user_cache"), self._own
        """))
    found = {name for name, _ in source_uses(fake)}
    assert {"_deep_merge", "_data", "_start", "_log_name", "_hub_auth_user_cache"} <= found
    assert "_own" not in found


def test_the_docs_list_what_is_relied_on():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## What we rely on in our dependencies", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(_\w+)` \|", section, flags=re.M))
    assert listed == set(RELIED_ON)


def _requirement(distribution: str) -> Requirement:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    lines = [*project["dependencies"],
             *(d for extra in project["optional-dependencies"].values() for d in extra)]
    (found,) = {Requirement(d) for d in lines if Requirement(d).name == distribution}
    return found


@pytest.mark.parametrize("package", sorted(set(RELIED_ON.values())))
def test_a_dependency_relied_on_is_pinned_below_its_next_minor(package):
    """Where a private name is used, a minor release may move it: the range stops at the
    next minor of the release the suite runs (raise it once the guards pass on a newer)."""
    if package not in dependency_names():
        pytest.skip(f"{package} is not installed")
    distribution = DEPENDENCIES[package]
    installed = Version(version(distribution))
    pin = _requirement(distribution)
    assert installed in pin.specifier
    assert f"{installed.major}.{installed.minor + 1}.0" not in pin.specifier, pin
    assert f"{installed.major + 1}.0.0" not in pin.specifier, pin


# --- the guards of the names relied on (_make_create_pod_request's is beside its test of
# the pod's order, tests/service/test_kube_spawner.py) ------------------------------------


def _method(cls: type, name: str) -> ast.AST:
    return ast.parse(textwrap.dedent(inspect.getsource(getattr(cls, name))))


def test_jupyterhub_resolves_its_start_future_once_it_has_started():
    """``JupyterHub._start_future``: made in ``initialize``, resolved at the end of
    ``start``. The hub runtime's first sync and Kubernetes' budget duties wait on it."""
    from jupyterhub.app import JupyterHub

    made = [n for n in ast.walk(_method(JupyterHub, "initialize"))
            if isinstance(n, ast.Assign) and any(
                isinstance(t, ast.Attribute) and t.attr == "_start_future" for t in n.targets)]
    assert made and ast.unparse(made[0].value) == "asyncio.Future()"
    resolved = [ast.unparse(n) for n in ast.walk(_method(JupyterHub, "start"))
                if isinstance(n, ast.Call)]
    assert "self._start_future.set_result(None)" in resolved


def test_kubespawner_starts_its_pod_reflector_as_poll_needs_it():
    """``KubeSpawner._start_watching_pods(replace=False)``: QuotaKubeSpawner's poll reads
    the pod from the reflector it starts, before KubeSpawner's poll deletes an ended one."""
    kubespawner = pytest.importorskip("kubespawner")
    method = kubespawner.KubeSpawner._start_watching_pods
    assert inspect.iscoroutinefunction(method)
    assert list(inspect.signature(method).parameters) == ["self", "replace"]
    assert inspect.signature(method).parameters["replace"].default is False


# --- what replaced the private names: as the dependencies did it ------------------------


def quota_spawner(server: str = "", **settings: Any) -> QuotaSpawner:
    c = Config()
    c.QuotaSpawner.usage_db = "none"
    for name, value in settings.items():
        setattr(c.QuotaSpawner, name, value)
    user = SimpleNamespace(name="O'Brien", escaped_name="o-27brien", url="/user/o/",
                           server=None, id=1)
    made = QuotaSpawner(config=c, orm_spawner=None, user=user)
    if server:
        made.orm_spawner = SimpleNamespace(name=server, server=None)
    return made


def test_the_log_name_is_the_user_and_the_named_server():
    assert quota_spawner().log_name == "O'Brien"
    assert quota_spawner("gpu").log_name == "O'Brien:gpu"


def test_templates_are_filled_as_dockerspawner_fills_them():
    namespace = {"username": "o-27brien", "servername": ""}
    value = {"binds": {"/srv/{username}": {"bind": "/data", "mode": "ro"}},
             "dns_search": ["{username}.lab"], "pair": ("{username}", 1),
             "keep": "{not-a-key} {", "unknown": "{nobody}", "n": 5, "none": None}
    assert filled_templates(value, namespace) == {
        "binds": {"/srv/o-27brien": {"bind": "/data", "mode": "ro"}},
        "dns_search": ["o-27brien.lab"], "pair": ("o-27brien", 1),
        "keep": "{not-a-key} {", "unknown": "{nobody}", "n": 5, "none": None}


async def test_an_admin_setting_may_be_a_callable_or_a_coroutine():
    spawner = quota_spawner(image="quota-spawner/pytorch:latest")

    async def later(s: Any) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"labels": {"lab/user": "{raw_username}"}}

    assert await spawner.admin_value(later) == {"labels": {"lab/user": "O'Brien"}}
    assert await spawner.admin_value(lambda s: {"dns": [s.user.name]}) == {"dns": ["O'Brien"]}
    assert await spawner.admin_value({"shm_size": "{imagename}"}) == {
        "shm_size": "quota-spawner-pytorch-latest"}
    assert await spawner.admin_value(None) == {}
