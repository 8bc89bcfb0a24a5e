"""How the tests share what they share: through fixtures in tests/conftest.py (or a
layer's own conftest.py) and the helper modules beside them, never by importing another
test module, so that a test module can be moved, renamed or changed without breaking
another (docs/deployment.md#tests-and-the-private-test-engine)."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
TEST_MODULES = {path.stem for path in TESTS.rglob("test_*.py")}
# the modules an import statement names, also in a script a test runs in a subprocess
FROM_IMPORT = re.compile(r"^\s*from\s+([\w.]+)\s+import\b", re.M)
IMPORT = re.compile(r"^\s*import\s+([\w.]+(?:\s+as\s+\w+)?(?:\s*,\s*[\w.]+(?:\s+as\s+\w+)?)*)",
                    re.M)
BY_NAME = re.compile(r"""(?:import_module|__import__)\(\s*["']([\w.]+)["']""")


def imported(text: str) -> list[tuple[int, str]]:
    """(line, module) for every module ``text`` imports by name."""
    found = []
    for pattern in (FROM_IMPORT, BY_NAME):
        found += [(m.start(), m.group(1)) for m in pattern.finditer(text)]
    for m in IMPORT.finditer(text):
        found += [(m.start(), name.split()[0]) for name in m.group(1).split(",")]
    return [(text.count("\n", 0, at) + 1, name.split(".")[0]) for at, name in found]


def test_the_scan_finds_every_way_of_naming_a_module():
    text = ("import os\nfrom test_a import x\n    import test_b as b, json\n"
            "importlib.import_module('test_c')\nfrom spawner.quota import units\n")
    assert sorted(imported(text)) == [(1, "os"), (2, "test_a"), (3, "json"), (3, "test_b"),
                                      (4, "test_c"), (5, "spawner")]


def test_no_test_module_is_imported_by_another_module_of_the_tests():
    """Shared fixtures live in a conftest.py, shared helpers in a helper module
    (tests/harness.py, hubs.py, ledger_sessions.py, service/webapp_client.py, ...); the
    modules that run others' tests again on PostgreSQL name them in AGAIN_ON_POSTGRESQL
    and tests/postgres.py collects them."""
    found = [f"{path.relative_to(TESTS.parent)}:{line}: imports {name}"
             for path in sorted(TESTS.rglob("*.py"))
             for line, name in imported(path.read_text(encoding="utf-8"))
             if name in TEST_MODULES]
    assert found == [], "\n".join(found)
