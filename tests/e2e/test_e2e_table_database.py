"""End to end: the quota table in the usage ledger's database (quota_source "database",
here from $QUOTA_SPAWNER_QUOTA_SOURCE, which the hub config reads and passes on to the
usage service), on a real hub, proxy, usage service and engine, with a PostgreSQL ledger
(a fresh database of the private test server, tests/postgres.py) and 3 declared GPUs.

The quota file is read-only: the hub seeds the database's first version from it at its
first read of the table, and never reads it again. A table the admin saves through the editor's API applies
at the next spawn; a bad one is refused by the editor with its line, and so is one the
hub's GPUs refuse (a role asking 4 of its 3); a bad version that reaches the database by
another route is refused by the hub, which logs it by version and line and runs the
newest good version, also after a restart, and the editor says which.
"""

from __future__ import annotations

import pytest
import requests
from browser import usage_config
from hubs import gpu_names
from postgres import fresh_database

from harness import Hub, container_for, free_port, gpu_inventory_config, teardown, wait_for
from spawner.contract import ROLE_LABEL
from spawner.quota.editing import FROM_FILE
from spawner.usage.ledger import Ledger
from spawner.usage.table_versions import Audit

pytestmark = pytest.mark.e2e
PREFIX = "qstabledb"
KEY = "database:default"

QUOTAS = """\
images:
  pytorch: {image: "quota-spawner/pytorch:latest"}
roles:
  small: {cpus: 0.25, memory: 512M, images: [pytorch]}
assignments:
  default: [small]
"""
# the admin's edit: a role "big" for everyone
WITH_BIG = QUOTAS.replace("roles:\n", "roles:\n  big: {cpus: 0.75, memory: 768M, "
                          "images: [pytorch]}\n").replace("[small]", "[small, big]")
BAD_LINE = 4  # the line of "big" in WITH_BIG
BAD = WITH_BIG.replace("cpus: 0.75", "cpus: lots")
# a role the hub's 3 GPUs can never serve: bad for this hub only
FOUR_GPUS = WITH_BIG.replace("cpus: 0.75,", "cpus: 0.75, gpus: 4,")
FOUR_PROBLEM = "role 'big': gpus is 4, but this hub has only 3 GPUs"
# a role larger than any host's share: it can never start on this hub, which loads it
HUGE = WITH_BIG.replace("memory: 768M", "memory: 64T")
HUGE_PROBLEM = ("role 'big' (0.75 CPUs, 64 TiB): none fit on this host: one server's 64 TiB "
                "of memory is more than the notebooks' ")


@pytest.fixture(scope="module")
def db_hub(docker_client, tmp_path_factory):
    with fresh_database() as db:
        found = Hub(tmp_path_factory.mktemp(PREFIX), quota_text=QUOTAS, prefix=PREFIX,
                    extra_config=usage_config(free_port())
                    + gpu_inventory_config(gpu_names(PREFIX, 3)),
                    env={"QUOTA_SPAWNER_QUOTA_SOURCE": "database",
                         "QUOTA_SPAWNER_USAGE_DB": db})
        found.quota_file.chmod(0o444)  # nothing needs to write it
        found.start()
        found.create_user("dana")
        found.admin = found.user_token("admin")
        yield found
        found.stop_servers(["dana"])
        teardown(found, docker_client, "table-database")


def editor(hub: Hub, method: str, path: str = "", body: dict | None = None):
    """The editor's API as the admin calls it, with a hub API token."""
    r = requests.request(method, f"{hub.url}/services/usage/api/table{path}", json=body,
                         headers={"Authorization": f"token {hub.admin}"}, timeout=60,
                         allow_redirects=False)
    return r.status_code, r.json() if r.headers.get("Content-Type", "").startswith(
        "application/json") else r.text


def test_a_table_saved_in_the_database_applies_and_a_bad_one_is_refused(db_hub,
                                                                         docker_client):
    hub = db_hub
    def table_now() -> dict | None:
        code, found = editor(hub, "GET")
        return found if code == 200 else None

    opened = wait_for(table_now, 60, "the usage service's editor")  # once the hub started it
    assert (opened["source"], opened["path"], opened["text"]) == ("database", KEY, QUOTAS)

    r = hub.spawn("dana", {"profile": "big"})
    assert r.status_code == 400 and "which you do not hold" in r.json()["message"], r.text
    audit = Audit(Ledger(hub.usage_db, create=False).engine)
    [seeded] = audit.versions(KEY)  # by the hub's first read of the table
    assert seeded.who == FROM_FILE and seeded.text == QUOTAS

    code, found = editor(hub, "POST", "", {"text": BAD, "version": opened["version"],
                                           "comment": "a big role"})
    assert code == 400, found
    assert [(p["file"], p["line"]) for p in found["problems"]] == [(KEY, BAD_LINE)]
    code, saved = editor(hub, "POST", "", {"text": WITH_BIG, "version": opened["version"],
                                           "comment": "a big role"})
    assert code == 200, saved

    # the next spawn has it: the role, and its limits on the container
    assert hub.start_server("dana", {"profile": "big"})["user_options"]["profile"] == "big"
    container = container_for(docker_client, "dana")
    assert container.labels[ROLE_LABEL] == "big"
    assert container.attrs["HostConfig"]["Memory"] == 768 * 2**20
    hub.stop_server("dana")

    # a bad version saved by another route than the editor: refused, with its line
    bad = audit.record(path=KEY, who="a script", comment="by hand", text=BAD,
                       previous=WITH_BIG)
    r = hub.spawn("dana", {"profile": "nothing-such"})
    # a refusal of the option, not the 500 of a table that cannot be used: the last good
    assert r.status_code == 400 and "which you do not hold" in r.json()["message"], r.text
    wait_for(lambda: f"quota table (database, version {bad}):{BAD_LINE}: role 'big': cpus "
             "must be a number" in hub.log(), 10, "the bad version in the hub's log")
    assert (f"Quota table (database, version {bad}) is invalid; using version "
            f"{saved['audit_id']}, the newest good version instead") in hub.log()
    assert hub.quota_file.read_text() == QUOTAS


def test_a_restarted_hub_runs_the_newest_good_version_and_the_editor_says_which(db_hub,
                                                                              docker_client):
    """Versions written around the editor: a good one, then one bad for its text and one
    the hub's 3 GPUs refuse. The editor refuses the second itself, and one whose role is
    larger than the hub's host; a hub restarted under them starts dana with the good one,
    and the editor names both bad ones."""
    hub = db_hub
    def against_three_gpus() -> dict | None:
        code, found = editor(hub, "GET")
        return found if code == 200 and "3 GPUs" in found["against"] else None

    opened = wait_for(against_three_gpus, 60, "the editor to know the hub's 3 GPUs")
    code, found = editor(hub, "POST", "", {"text": FOUR_GPUS, "version": opened["version"],
                                           "comment": "four GPUs"})
    assert code == 400 and [(p["line"], p["message"]) for p in found["problems"]] == [
        (BAD_LINE, FOUR_PROBLEM)], found
    code, found = editor(hub, "POST", "", {"text": HUGE, "version": opened["version"],
                                           "comment": "a huge role"})
    assert code == 400 and [(p["line"], p["message"][:len(HUGE_PROBLEM)])
                            for p in found["problems"]] == [(BAD_LINE, HUGE_PROBLEM)], found
    assert "its host: notebooks may reserve" in found["against"]

    audit = Audit(Ledger(hub.usage_db, create=False).engine)
    good = audit.record(path=KEY, who="a script", comment="big", text=WITH_BIG,
                        previous=None)
    bad = audit.record(path=KEY, who="a script", comment="typo", text=BAD, previous=None)
    four = audit.record(path=KEY, who="a script", comment="four", text=FOUR_GPUS,
                        previous=None)
    hub.stop()
    hub.start()  # nothing good in memory now: only the database's versions
    assert hub.start_server("dana", {"profile": "big"})["user_options"]["profile"] == "big"
    container = container_for(docker_client, "dana")
    assert container.labels[ROLE_LABEL] == "big"
    assert container.attrs["HostConfig"]["Memory"] == 768 * 2**20
    hub.stop_server("dana")
    log = hub.log()
    # the log's lines after the first are indented
    assert (f"Quota table (database, version {four}) is invalid; using version {good}, the "
            f"newest good version instead:\n"
            f"    quota table (database, version {four}):{BAD_LINE}: {FOUR_PROBLEM}\n"
            f"    quota table (database, version {bad}):{BAD_LINE}: role 'big': cpus must "
            "be a number") in log
    assert "no good table yet" not in log

    def names_the_bad_ones() -> dict | None:  # the restarted service, once it knows the GPUs
        found = against_three_gpus()
        return found["running"] if found and found["running"]["newest"] == four else None

    running = wait_for(names_the_bad_ones, 60, "the editor's answer")
    assert (running["runs"], [v["version"] for v in running["passed_over"]]) == (
        good, [four, bad])
