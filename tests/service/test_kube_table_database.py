"""QuotaKubeSpawner with quota_source "database", without a cluster (FakeCluster of
kube_spawners.py): its starts read the ledger's newest version of the table, which the
ConfigMap's file only seeded; a version the editor saves applies at the next start, and a
bad one saved by another route is refused with its line while the newest good version runs,
in this process and in a restarted one."""

from __future__ import annotations

import logging
import shutil
from typing import Any

import pytest

pytest.importorskip("kubespawner")

from kube_spawners import SHIPPED, make, sessions, spawner_on  # noqa: E402
from traitlets import TraitError  # noqa: E402

from spawner.common.registry import Registry  # noqa: E402
from spawner.kube.spawner import QuotaKubeSpawner  # noqa: E402
from spawner.quota.editing import FROM_FILE, TableVersions  # noqa: E402
from spawner.quota.store import QuotaStore  # noqa: E402
from spawner.usage.table_versions import Audit  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_cluster")  # tests/service/conftest.py

LOG = logging.getLogger("test-kube-table-database")
KEY = "database:default"
SENIOR_CPUS = "    cpus: 4\n"  # senior-engineer's, the first of the shipped table's



@pytest.fixture
def configmap(tmp_path):
    """The shipped table where a ConfigMap puts it: read-only, in a read-only folder."""
    path = tmp_path / "configmap" / "quotas.yaml"
    path.parent.mkdir()
    shutil.copy(SHIPPED, path)
    path.chmod(0o444)
    path.parent.chmod(0o555)
    yield path
    path.parent.chmod(0o755)


async def start_senior(monkeypatch: pytest.MonkeyPatch, url: str, quota: Any,
                       ledger: Any) -> dict[str, Any]:
    """A start and stop of senior-engineer (user cy) on the database source; its session."""
    spawner, _ = spawner_on(monkeypatch, url, quota, quota_source="database")
    spawner.log = LOG
    spawner.user_options = {"profile": "senior-engineer"}
    await spawner.start()
    await spawner.stop()
    return sessions(ledger)[-1]


async def test_starts_read_the_newest_version_and_refuse_a_bad_one(monkeypatch, ledger_url,
                                                                    ledger, configmap, caplog):
    url = ledger_url
    audit = Audit(ledger.engine)
    assert (await start_senior(monkeypatch, url, configmap, ledger))["cpu_limit"] == 4.0
    [seeded] = audit.versions(KEY)  # the first start seeded it from the ConfigMap's file
    assert seeded.who == FROM_FILE and seeded.text == configmap.read_text()

    editor = TableVersions("default", audit, str(configmap))
    text, version = editor.read()
    saved = editor.save(text.replace(SENIOR_CPUS, "    cpus: 6\n", 1), version, "admin",
                        "more CPUs", audit)
    assert saved.saved
    assert (await start_senior(monkeypatch, url, configmap, ledger))["cpu_limit"] == 6.0

    line = text.splitlines().index(SENIOR_CPUS.rstrip("\n")) + 1
    bad = audit.record(path=KEY, who="a script", comment="by hand",
                       text=text.replace(SENIOR_CPUS, "    cpus: lots\n", 1),
                       previous=text)
    with caplog.at_level(logging.INFO, LOG.name):
        assert (await start_senior(monkeypatch, url, configmap, ledger))["cpu_limit"] == 6.0
    assert (f"quota table (database, version {bad}):{line}: role 'senior-engineer': cpus "
            "must be a number, like 2 or 0.5, not text 'lots'") in caplog.text
    assert f"using version {saved.audit_id}, the newest good version instead" in caplog.text
    # a restarted hub (a new store) runs the newest good version too, never "no good table"
    monkeypatch.setattr(QuotaStore, "_stores", Registry())
    assert (await start_senior(monkeypatch, url, configmap, ledger))["cpu_limit"] == 6.0
    assert configmap.read_text() == SHIPPED.read_text()


async def test_the_settings_of_the_source(monkeypatch):
    monkeypatch.delenv("QUOTA_SPAWNER_QUOTA_SOURCE", raising=False)
    monkeypatch.delenv("QUOTA_SPAWNER_QUOTA_TABLE_NAME", raising=False)
    spawner = make(QuotaKubeSpawner)
    assert (spawner.quota_source, spawner.quota_table_name) == ("file", "default")
    monkeypatch.setenv("QUOTA_SPAWNER_QUOTA_SOURCE", "Database")
    monkeypatch.setenv("QUOTA_SPAWNER_QUOTA_TABLE_NAME", "lab")
    spawner = make(QuotaKubeSpawner)
    assert (spawner.quota_source, spawner.quota_table_name) == ("database", "lab")
    with pytest.raises(TraitError):
        make(QuotaKubeSpawner, quota_source="yaml")
    with pytest.raises(TraitError):
        make(QuotaKubeSpawner, quota_table_name="a table")
