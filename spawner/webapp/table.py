"""The quota table editor, for admins only (docs/table-editor.md): its page and its JSON API.

``GET {prefix}table`` shows the table in a browser editor (CodeMirror 6 with the table's
JSON Schema, bundled into ``static/editor.js`` from ``editor/`` by ``make editor``; no
asset from the network). The page only shows; it reads, checks, previews and saves
through the JSON API, with the service's XSRF token, which the page carries:

- ``GET api/table``: the table's text, its version (sha256), path, JSON Schema, problems,
  what they are checked ``against``, and (a database table) ``running``;
- ``POST api/table/check`` ``{text}``: its problems, ``FILE:LINE`` as the CLI prints
  them, and what they are checked ``against``;
- ``POST api/table/preview`` ``{text}``: who gains and loses what, as sentences and details;
- ``POST api/table`` ``{text, version, comment}``: save; 400 with the problems or when the
  comment is missing, 409 with the diffs when the file changed since ``version``;
- ``GET api/table/versions``, ``GET api/table/versions/<id>``: the audit trail;
- ``POST api/table/versions/<id>/restore`` ``{comment, version}``: save that version again.

Only admins (``admin`` true in the hub's user model) may use either: the usage page's
viewers and instructors are refused with a sentence. The check, the preview and the save
are spawner/quota/editing.py's, against the hub's GPU inventory and host as its pool
snapshot tells it (``hub_room``), as ``quota-spawner validate --gpus N --gpu-memory
SIZE --engine``: a table the hub would refuse is never saved, nor one with a role larger
than the host's share, which can never start there (spawner/host/fit.py's
``never_fit``). Without a snapshot the table is checked for everything else, and the
answers say so (``against``). The audit trail is the ledger's ``table_versions``
(spawner/usage/table_versions.py). With ``quota_source`` "database" the table edited is
the newest of those versions (``TableVersions``): a save adds one, and the file, only the
first version's seed, is never written; the answers then say which version the hub runs
(``running``: the newest good one, ``table_versions.newest_good``) and which newer ones
are bad. Files and the ledger are read and written on the
service's worker threads; the hub's users, groups and running servers are read with the
service's own token (``list:users``, ``read:users:groups``, ``read:servers``).
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict
from functools import cache
from typing import Any, TypeVar

from tornado import web

from spawner.gpu.snapshot import HubRoom, PoolSnapshot, hub_room
from spawner.host.fit import never_fit
from spawner.quota.editing import (
    CONFLICT,
    DATABASE_SOURCE,
    NOT_FOUND,
    UNCHANGED,
    EditableTable,
    Fits,
    SaveResult,
    TableFile,
    TableVersions,
    Version,
    checked_table,
    database_key,
    preview,
    trail_key,
)
from spawner.quota.model import GpuCapacity, Problem, QuotaTable, QuotaTableError
from spawner.quota.schema import quota_table_schema
from spawner.quota.units import format_human, format_size
from spawner.usage.table_versions import Audit, newest_good
from spawner.webapp import inputs
from spawner.webapp.access import Refused
from spawner.webapp.base import ApiHandler, BaseHandler, PageHandler
from spawner.webapp.hub_api import HubApi

T = TypeVar("T")
log = logging.getLogger("quota_spawner.usage")

ADMINS_ONLY = ("The quota table can be edited by admins only. Ask an admin if a role or "
               "a limit should change.")
NO_TABLE = ("This service has no quota table to edit: the hub did not give it one "
            "(QUOTA_SPAWNER_QUOTA_FILE).")
NO_HUB_API = ("The preview needs the hub's API, and this service was not given its "
              "address (JUPYTERHUB_API_URL).")

# users -> their groups, and users -> the role their running server was started with
Directory = tuple[dict[str, list[str]], dict[str, str]]


@cache
def table_schema() -> dict[str, Any]:
    """The quota table's JSON Schema, made from its field declarations, for the editor."""
    return quota_table_schema()


def problems_json(problems: Any) -> list[dict[str, Any]]:
    return [{"file": p.file, "line": p.line, "message": p.message} for p in problems]


async def hub_directory(hub: HubApi) -> Directory:
    """Every user's groups and the role of their running server, from the hub's REST
    API with the service's token, for the preview."""
    users: dict[str, list[str]] = {}
    running: dict[str, str] = {}
    for user in await hub.require(NO_HUB_API).users(hub.service_token):
        users[user["name"]] = list(user.get("groups") or [])
        servers = user.get("servers") or {}
        # the default server first: the preview counts one server per user
        for name in sorted(servers, key=lambda n: (n != "", n)):
            role = (servers[name].get("user_options") or {}).get("profile")
            if role:
                running[user["name"]] = str(role)
                break
    return users, running


def _version_json(v: Version, full: bool = False) -> dict[str, Any]:
    found = {"id": v.id, "at": v.at, "who": v.who, "comment": v.comment, "sha": v.sha256,
             "restored_from": v.restored_from}
    if full:
        found.update(text=v.text, diff=v.diff)
    return found


class ServedTables:
    """The texts this service last showed, by version: a conflict's "what changed since
    you started" needs the text the admin started from, which the audit trail lacks
    when that version was written outside the editor (by hand, by a deploy)."""

    KEEP = 16  # versions; an admin who started from an older one gets no "since" diff

    def __init__(self) -> None:
        self._texts: OrderedDict[str, str] = OrderedDict()

    def remember(self, version: str, text: str) -> None:
        self._texts[version] = text
        self._texts.move_to_end(version)
        while len(self._texts) > self.KEEP:
            self._texts.popitem(last=False)

    def get(self, version: str) -> str | None:
        return self._texts.get(version)


SERVED = ServedTables()  # one service process, one memory


def _lf(text: str) -> str:
    return text.replace("\r\n", "\n")


def _comment(body: dict[str, Any]) -> str:
    """A save's comment: missing is empty (the save says it is needed), else bounded."""
    found = body.get("comment")
    return inputs.text(found, "comment", inputs.MAX_COMMENT) if found is not None else ""


# --- what the table is checked against: the hub's room ---------------------------------------

UNKNOWN_ROOM = ("This service does not know the hub's GPUs and host yet (a Docker hub "
                "publishes them when it starts; a Kubernetes cluster's are its scheduler's), "
                "so the table is checked for everything else, not against them.")


def _plural(count: float, word: str) -> str:
    return f"{count:g} {word}{'' if count == 1 else 's'}"


def against(room: HubRoom | None) -> str:
    """What a table is checked against, in one sentence for the admin."""
    if room is None:
        return UNKNOWN_ROOM
    gpus = room.gpus
    if gpus.count == 0:
        said = ("Checked against this hub, which has no GPUs (its GPU roles are refused "
                "when they start)")
    else:
        smallest = flag = ""
        if gpus.smallest_memory:
            smallest = f", the smallest with {format_human(gpus.smallest_memory)}"
            flag = f" --gpu-memory {format_size(gpus.smallest_memory)}"
        said = (f"Checked against this hub's {_plural(gpus.count, 'GPU')}{smallest}, as "
                f"quota-spawner validate --gpus {gpus.count}{flag}")
    if room.host is None:
        return said + "; its host's room is not counted (host admission is off)."
    share = room.host.share
    return (said + f", and its host: notebooks may reserve {_plural(share.cpus, 'CPU')} and "
            f"{format_human(share.memory)} (a role larger than that can never start here, "
            "so it is a problem).")


def checks(room: HubRoom | None) -> tuple[GpuCapacity | None, Fits | None]:
    """What a table is checked against in ``room``: the hub's GPUs, and the roles that
    can never start on its host (``never_fit``); None for what it does not know."""
    if room is None:
        return None, None
    host = room.host
    return room.gpus, (None if host is None else lambda table: never_fit(table, host))


def checked(text: str, path: str, room: HubRoom | None
            ) -> tuple[QuotaTable | None, list[Problem]]:
    """``text`` as a table, or None and its problems against the hub's GPUs (as the
    hub's store finds them) and host (as ``validate --engine``); a save is refused for
    any."""
    return checked_table(text, path, *checks(room))


def running(audit: Audit, key: str, gpus: GpuCapacity | None) -> dict[str, Any]:
    """Which version of a database table the hub runs (the newest good one, as its store
    chooses) and the newer ones it passes over, with their problems (blocking)."""
    try:
        good = newest_good(audit, key, gpus)
    except QuotaTableError as e:  # no version is good
        newest = audit.newest(key)
        return {"newest": newest[0] if newest else None, "runs": None,
                "passed_over": [], "problems": problems_json(e.problems)}
    if good is None:  # no version yet: the file seeds the first
        return {"newest": None, "runs": None, "passed_over": [], "problems": []}
    passed = [{"version": v.id, "problems": problems_json(found)}
              for v, found in good.passed_over]
    return {"newest": passed[0]["version"] if passed else good.version.id,
            "runs": good.version.id, "passed_over": passed, "problems": []}


def running_sentence(found: dict[str, Any] | None) -> str:
    """What the hub runs, when it is not the newest version; "" when it is."""
    if not found or found["newest"] is None:
        return ""
    if found["runs"] is None:
        return (f"No version of the table is good, so no server can start: version "
                f"{found['newest']}, the newest, has problems. Fix it below and save.")
    if not found["passed_over"]:
        return ""
    newer = [v["version"] for v in found["passed_over"]]
    which = (f"Version {newer[0]}, the newest, has problems" if len(newer) == 1 else
             f"Versions {', '.join(str(v) for v in reversed(newer))} have problems"
             if len(newer) <= 3 else
             f"The {len(newer)} newest versions, {newer[-1]} to {newer[0]}, have problems")
    return (f"{which}, so the hub runs version {found['runs']}, the newest good version. "
            f"The text below is version {newer[0]}: fix it and save, or restore version "
            f"{found['runs']}.")


class TableEditor(BaseHandler):
    """Shared by the page and the endpoints: admins only, the table the hub reads."""

    refused = ADMINS_ONLY

    @property
    def in_database(self) -> bool:
        return self.setup.quota_source == DATABASE_SOURCE

    @property
    def table_path(self) -> str:
        """The table's file, or its key in the database (database:<name>): the trail's."""
        if self.in_database:
            return database_key(self.setup.quota_table_name)
        if not self.setup.quota_file:
            raise Refused(NO_TABLE, 404)
        return self.setup.quota_file

    async def room(self) -> HubRoom | None:
        """The hub's GPU inventory and host share, from its pool snapshot; None while it
        has published none, or it cannot be read (logged)."""
        try:
            return await self.blocking(lambda: hub_room(PoolSnapshot.read(self.setup.documents())))
        except Exception as e:  # the check goes on without it, and says so
            log.warning("Table editor: could not read the hub's GPU inventory: %s", e)
            return None

    async def on_table(self, fn: Callable[[EditableTable, Audit | None], T], *,
                       ledger: bool = False, room: HubRoom | None = None) -> T:
        """``fn(table, audit)`` on the worker threads: the file, or the table's versions in
        the ledger's database, checked against ``room``'s GPUs and host, and the audit
        trail (None when ``ledger`` is False and the table is the file, read without the
        ledger)."""
        path = self.table_path
        gpus, fits = checks(room)
        if self.in_database:
            seed = self.setup.quota_file

            def versions(engine: Any) -> T:
                audit = Audit(engine)
                return fn(TableVersions(self.setup.quota_table_name, audit, seed, gpus,
                                        fits), audit)

            return await self.reader.run(versions)
        file = TableFile(path, gpus, fits)
        if ledger:
            return await self.reader.run(lambda engine: fn(file, Audit(engine)))
        return await self.blocking(fn, file, None)

    async def read(self) -> dict[str, Any]:
        """The table's text, version, path, problems, what they are checked against, and
        (a database table) which version the hub runs; on the worker threads."""
        room = await self.room()

        def read(table: EditableTable, audit: Audit | None) -> dict[str, Any]:
            text, version = table.read()
            SERVED.remember(version, text)
            _, problems = checked(text, table.path, room)
            found = {"text": text, "version": version, "path": table.path,
                     "problems": problems_json(problems), "against": against(room),
                     "running": None}
            if self.in_database and audit is not None:
                found["running"] = running(audit, table.path, room.gpus if room else None)
            return found

        return await self.on_table(read, room=room)


# --- the page ----------------------------------------------------------------------------------


class TablePage(TableEditor, PageHandler):
    """GET {prefix}table: the editor, with the table's text, version, schema and problems."""

    page_title = "Quota table"
    scripts = ("editor.js",)

    @web.authenticated
    async def get(self) -> None:
        self.require_admin(ADMINS_ONLY, "Table editor page")
        found = await self.read()
        self.render_page(
            "table.html", title="Quota table", path=found["path"], text=found["text"],
            in_database=self.in_database, seed=self.setup.quota_file,
            version=found["version"], problems=found["problems"],
            problems_json=json.dumps(found["problems"]),
            against=found["against"], runs=running_sentence(found["running"]),
            schema_json=json.dumps(table_schema(), separators=(",", ":")),
            xsrf=self.xsrf(), api=self.prefix + "api/table")


# --- the API -----------------------------------------------------------------------------------


class TableApi(TableEditor, ApiHandler):
    """Shared by the editor's endpoints: admins only, JSON in and out."""

    missing = "There is no such version or endpoint here."

    def admin(self) -> str:
        return self.require_admin(ADMINS_ONLY, "Table editor")

    async def audit(self, fn: Callable[[Audit], Any]) -> Any:
        """``fn(Audit)`` on the worker threads, with the ledger's engine."""
        return await self.reader.run(lambda engine: fn(Audit(engine)))

    def saved(self, result: SaveResult, room: HubRoom | None) -> None:
        """A save's or a restore's answer: 200, or why nothing was written; each says
        what the table was checked against."""
        if result.saved or result.outcome == UNCHANGED:
            message = result.message
            if result.saved and room is None:
                message += (" It was not checked against the hub's GPUs and host: this "
                            "service does not know them yet.")
            self.reply({"version": result.version, "audit_id": result.audit_id,
                        "message": message, "diff": result.diff, "against": against(room)})
        elif result.outcome == CONFLICT:
            self.reply({"message": result.message, "version": result.version,
                        "diff": result.diff, "yours": result.yours,
                        "current_text": result.current_text}, 409)
        elif result.outcome == NOT_FOUND:
            self.reply({"message": result.message}, 404)
        else:  # INVALID, NO_COMMENT
            self.reply({"message": result.message, "version": result.version,
                        "problems": problems_json(result.problems),
                        "against": against(room)}, 400)


class TableHandler(TableApi):
    """GET: the table as it is. POST: save an edit."""

    @web.authenticated
    async def get(self) -> None:
        self.admin()
        found = await self.read()
        self.reply({"text": found["text"], "version": found["version"], "path": found["path"],
                    "source": self.setup.quota_source, "problems": found["problems"],
                    "against": found["against"],
                    "running": found["running"], "schema": table_schema()})

    @web.authenticated
    async def post(self) -> None:
        who = self.admin()
        body = self.body("text", "version")
        comment = _comment(body)
        started_from = SERVED.get(body["version"])
        room = await self.room()
        result = await self.on_table(lambda table, audit: table.save(
            _lf(body["text"]), body["version"], who, comment, audit, base_text=started_from),
            ledger=True, room=room)
        if result.saved:
            log.info("Table editor: %s saved %s (audit %s)", who, self.table_path,
                     result.audit_id)
        self.saved(result, room)


class CheckHandler(TableApi):
    """POST {text}: the edit's problems, as fast as a parse."""

    @web.authenticated
    async def post(self) -> None:
        self.admin()
        text = _lf(self.body("text")["text"])
        path = self.table_path
        room = await self.room()
        # on the worker threads: a large table's check must not hold up other visitors
        _, problems = await self.blocking(checked, text, path, room)
        self.reply({"problems": problems_json(problems), "against": against(room)})


class PreviewHandler(TableApi):
    """POST {text}: what the edit changes for the hub's users and running servers."""

    @web.authenticated
    async def post(self) -> None:
        self.admin()
        text = _lf(self.body("text")["text"])
        room = await self.room()

        def tables(table: EditableTable, _: Audit | None
                   ) -> tuple[QuotaTable | None, QuotaTable | None, list[Problem]]:
            old, _ = checked_table(table.read()[0], table.path)
            new, problems = checked(text, table.path, room)
            return old, new, problems

        old, new, problems = await self.on_table(tables, room=room)
        if new is None:
            self.reply({"message": "The table has problems; fix them to see the preview.",
                        "problems": problems_json(problems)}, 400)
            return
        if old is None:
            self.reply({"sentences": ["The table as it is now has problems, so there is "
                                      "nothing to compare with: every role is new."],
                        "details": None})
            return
        try:
            users, running = await hub_directory(self.setup.hub)
        except Refused:
            raise
        except Exception as e:
            log.warning("Table editor: could not read the hub's users: %s", e)
            raise Refused("The preview needs the hub's list of users, and the hub did not "
                          "answer; try again in a moment.", 503) from None

        def compare() -> dict[str, Any]:
            found = preview(old, new, users, running)
            return {"sentences": found.sentences(), "details": asdict(found)}

        self.reply(await self.blocking(compare))


class VersionsHandler(TableApi):
    """GET: the audit trail, newest first."""

    @web.authenticated
    async def get(self) -> None:
        self.admin()
        path = self.table_path
        found = await self.audit(lambda audit: audit.versions(path))
        self.reply({"versions": [_version_json(v) for v in found]})


class VersionHandler(TableApi):
    """GET: one version, with its text and its diff from the one before."""

    @web.authenticated
    async def get(self, version_id: str) -> None:
        self.admin()
        key = trail_key(self.table_path)
        number = inputs.record_id(version_id, "version")

        def one(audit: Audit) -> Version | None:
            found = audit.version(number)
            return found if found and found.path == key else None

        found = await self.audit(one)
        if found is None:
            raise Refused(f"There is no version {version_id} of this table.", 404)
        self.reply(_version_json(found, full=True))


class RestoreHandler(TableApi):
    """POST {comment, version}: save an earlier version again, as a save would."""

    @web.authenticated
    async def post(self, version_id: str) -> None:
        who = self.admin()
        number = inputs.record_id(version_id, "version")
        body = self.body("version")
        comment = _comment(body)
        room = await self.room()
        result = await self.on_table(lambda table, audit: audit.restore(
            number, who, comment, table, base_version=body["version"]), ledger=True,
            room=room)
        if result.saved:
            log.info("Table editor: %s restored version %s of %s (audit %s)", who,
                     version_id, self.table_path, result.audit_id)
        self.saved(result, room)


def routes(prefix: str) -> list[tuple[str, type[web.RequestHandler]]]:
    return [
        (prefix + "table", TablePage),
        (prefix + "api/table", TableHandler),
        (prefix + "api/table/check", CheckHandler),
        (prefix + "api/table/preview", PreviewHandler),
        (prefix + "api/table/versions", VersionsHandler),
        (prefix + r"api/table/versions/(\d+)", VersionHandler),
        (prefix + r"api/table/versions/(\d+)/restore", RestoreHandler),
    ]
