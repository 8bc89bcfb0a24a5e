"""The web app as a process: ``QuotaWebApp``, its settings, its routes, and the managed
service the hub's config starts it as (``webapp_service``).

The hub starts it as the service ``usage`` (``python -m spawner.webapp``), behind its
OAuth at ``/services/usage/``, with its settings in the environment: JupyterHub's own
``JUPYTERHUB_*`` variables for every managed service (where to listen, the URL prefix,
the hub's API and the service's token) and the ``QUOTA_SPAWNER_*`` ones the config
passes on. Each setting is a trait whose default is read from its variable, so the
same settings can be given on the command line (``--help-all`` lists them) or in a
config file. docs/usage.md#settings lists them.

The routes are the resource modules' (report.py, table.py, gpus.py, classes.py,
requests.py), the pages' scripts under ``static/`` and the OAuth callback; the
class dashboard's ``Prewarmer`` (prewarm.py) runs beside them.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from datetime import timezone, tzinfo
from typing import Any
from urllib.parse import urlparse
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from jupyterhub.services.auth import HubOAuthCallbackHandler
from tornado import web
from tornado.httpserver import HTTPServer
from traitlets import CaselessStrEnum, Float, TraitError, Unicode, default, validate
from traitlets.config import Application, Config

from spawner.common.moved import config_sections, moved_name
from spawner.policy.config import (
    hub_id_environment,
    hub_id_from_secret_file,
    valid_table_name,
)
from spawner.quota.editing import (
    DATABASE_SOURCE,
    DEFAULT_TABLE_NAME,
    FILE_SOURCE,
    SOURCES,
)
from spawner.quota.store import QuotaStore
from spawner.usage import event_store
from spawner.usage.documents import DatabaseDocuments, Documents, FolderDocuments
from spawner.usage.event_log import EventLog, events_path
from spawner.usage.ledger import default_url
from spawner.usage.table_versions import DatabaseSource
from spawner.webapp import classes, gpus, inputs, report, requests, table
from spawner.webapp.access import SCOPE
from spawner.webapp.base import STATIC, Setup, StaticFiles, templates
from spawner.webapp.hub_api import HubApi
from spawner.webapp.prewarm import Prewarmer
from spawner.webapp.reader import LedgerReader

log = logging.getLogger("quota_spawner.usage")

CUSTOM_SCOPES = {SCOPE: {
    "description": "See the usage page: every session, or with !group= the sessions of "
                   "that group's members.",
}}
DEFAULT_URL = "http://127.0.0.1:8182"
DEFAULT_PREFIX = "/services/usage/"
# What the service's own token may read: the table editor's preview needs every user's
# groups and the role of each running server, the role requests the requesters' groups.
SERVICE_SCOPES = ("list:users", "read:users:groups", "read:servers")
LOG_FORMAT = "[%(levelname).1s %(asctime)s quota-spawner usage] %(message)s"
# The hub's variables that reach the service when set (a managed service gets only
# what its definition names).
PASSED_ON = ("QUOTA_SPAWNER_USAGE_TZ", "QUOTA_SPAWNER_USAGE_LOG_LEVEL", "QUOTA_SPAWNER_HUB_ID",
             "QUOTA_SPAWNER_PREWARM_INTERVAL", "QUOTA_SPAWNER_EVENTS_FILE",
             "QUOTA_SPAWNER_QUOTA_SOURCE", "QUOTA_SPAWNER_QUOTA_TABLE_NAME")


def _env(name: str, fallback: str = "") -> str:
    return os.environ.get(name) or fallback


def _time_zone(name: str) -> str:
    """``name``, when it names a time zone; else TraitError."""
    if name.upper() != "UTC":
        try:
            ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise TraitError(f"{name!r} is not a time zone (e.g. Europe/Berlin)") from None
    return name


class QuotaWebApp(Application):
    """The web app's process: its settings, the tornado app they make, and the server."""

    name = "quota-spawner-usage"
    description = ("The hub's web app (the managed service 'usage'): the usage report, the "
                   "quota table editor, the host map, the class dashboard and role requests.")
    aliases = {
        "usage-db": "QuotaWebApp.usage_db",
        "quota-file": "QuotaWebApp.quota_file",
        "quota-source": "QuotaWebApp.quota_source",
        "state-dir": "QuotaWebApp.state_dir",
        "bind-url": "QuotaWebApp.bind_url",
        "time-zone": "QuotaWebApp.time_zone",
        "log-level": "Application.log_level",
    }

    usage_db = Unicode(
        config=True,
        help="""The usage ledger's SQLAlchemy URL: the hub's QuotaSpawner.usage_db. Default:
        $QUOTA_SPAWNER_USAGE_DB, else quota-spawner-usage.sqlite in the state folder (or
        the working directory). The service reads it and never creates it.""")
    quota_file = Unicode(
        config=True,
        help="""The quota table (QuotaSpawner.quota_file): the report's advice, the
        editor's file, the class dashboard's choices, the requestable roles; with
        quota_source "database", only the first version's seed. Default:
        $QUOTA_SPAWNER_QUOTA_FILE; empty: none.""")
    quota_source = CaselessStrEnum(
        list(SOURCES), config=True,
        help="""Where the quota table lives: the hub's QuotaSpawner.quota_source. "file":
        quota_file, which the editor writes. "database": the newest version in the
        ledger's table_versions under database:<quota_table_name>, which the editor
        saves to (it needs no write access to the file). Default:
        $QUOTA_SPAWNER_QUOTA_SOURCE, else "file".""")
    quota_table_name = Unicode(
        config=True,
        help=f"""With quota_source "database": the table's name (QuotaSpawner.
        quota_table_name). Default: $QUOTA_SPAWNER_QUOTA_TABLE_NAME, else
        {DEFAULT_TABLE_NAME!r}.""")
    state_dir = Unicode(
        config=True,
        help="""The hub's state folder, where the GPU pool's and the watchdog's files are
        (the host map, the class dashboard's GPU memory) and, with usage_db "none", the
        hub's event log file (role requests' changes). Default: $QUOTA_SPAWNER_STATE_DIR;
        empty: none.""")
    events_file = Unicode(
        config=True,
        help="""A file role requests' events are appended to as JSON lines (relative: in
        state_dir), besides the ledger's events table: the hub's
        QuotaSpawner.events_file. Default: $QUOTA_SPAWNER_EVENTS_FILE; empty: the events
        table only.""")
    service_prefix = Unicode(
        config=True,
        help=f"""The URL prefix the hub's proxy forwards to the service. Default:
        $JUPYTERHUB_SERVICE_PREFIX, which the hub sets, else {DEFAULT_PREFIX}.""")
    bind_url = Unicode(
        config=True,
        help=f"""Where the service listens. Default: $JUPYTERHUB_SERVICE_URL, which the hub
        sets from the service's url (the hub config's $QUOTA_SPAWNER_USAGE_URL), else
        {DEFAULT_URL}.""")
    hub_base_url = Unicode(
        config=True,
        help="""The hub's base URL, for the links to the hub's home and to servers.
        Default: $JUPYTERHUB_BASE_URL, which the hub sets, else /.""")
    hub_api_url = Unicode(
        config=True,
        help="""The hub's REST API: the table preview's users, the requesters' groups, the
        class dashboard's members and servers. Default: $JUPYTERHUB_API_URL, which the hub
        sets.""")
    hub_api_token = Unicode(
        config=True,
        help="""The service's own token for the hub's API (its role usage-service), for
        what nobody is there to do: the preview, the requesters' groups, scheduled
        pre-warms. Default: $JUPYTERHUB_API_TOKEN, which the hub sets.""")
    hub_id = Unicode(
        config=True,
        help="""The hub's id, in the events role requests append to the hub's event log.
        Default: $QUOTA_SPAWNER_HUB_ID; empty: derived from hub_secret_file, as the
        spawner derives its own.""")
    hub_secret_file = Unicode(
        config=True,
        help="""With no hub_id: the hub's cookie_secret_file, from which the hub's id is
        derived. Default: $QUOTA_SPAWNER_HUB_SECRET_FILE.""")
    hub_prefix = Unicode(
        config=True,
        help="""The hub's QuotaSpawner.prefix, part of the derived hub id. Default:
        $QUOTA_SPAWNER_PREFIX, else quota.""")
    time_zone = Unicode(
        config=True,
        help="""The time zone of the pages' days, months and times, e.g. Europe/Berlin.
        Default: $QUOTA_SPAWNER_USAGE_TZ, else UTC.""")
    prewarm_interval = Float(
        config=True,
        help="""Seconds between the class dashboard's looks for due pre-warm schedules (at
        least 0.5). Default: $QUOTA_SPAWNER_PREWARM_INTERVAL, else 30: a lab's servers start
        within half a minute of the time asked.""")

    @default("usage_db")
    def _usage_db_default(self) -> str:
        return _env("QUOTA_SPAWNER_USAGE_DB") or default_url(self.state_dir)

    @default("quota_file")
    def _quota_file_default(self) -> str:
        return _env("QUOTA_SPAWNER_QUOTA_FILE")

    @default("quota_source")
    def _quota_source_default(self) -> str:
        return _env("QUOTA_SPAWNER_QUOTA_SOURCE").lower() or FILE_SOURCE

    @default("quota_table_name")
    def _quota_table_name_default(self) -> str:
        return _env("QUOTA_SPAWNER_QUOTA_TABLE_NAME", DEFAULT_TABLE_NAME)

    _valid_quota_table_name = validate("quota_table_name")(valid_table_name)

    @default("state_dir")
    def _state_dir_default(self) -> str:
        return _env("QUOTA_SPAWNER_STATE_DIR")

    @default("events_file")
    def _events_file_default(self) -> str:
        return _env("QUOTA_SPAWNER_EVENTS_FILE")

    @default("service_prefix")
    def _service_prefix_default(self) -> str:
        return _env("JUPYTERHUB_SERVICE_PREFIX", DEFAULT_PREFIX)

    @validate("service_prefix")
    def _valid_prefix(self, proposal: dict[str, Any]) -> str:
        prefix = str(proposal["value"])
        return prefix if prefix.endswith("/") else prefix + "/"

    @default("bind_url")
    def _bind_url_default(self) -> str:
        return _env("JUPYTERHUB_SERVICE_URL", DEFAULT_URL)

    @default("hub_base_url")
    def _hub_base_url_default(self) -> str:
        return _env("JUPYTERHUB_BASE_URL", "/")

    @default("hub_api_url")
    def _hub_api_url_default(self) -> str:
        return _env("JUPYTERHUB_API_URL")

    @default("hub_api_token")
    def _hub_api_token_default(self) -> str:
        return _env("JUPYTERHUB_API_TOKEN")

    @default("hub_id")
    def _hub_id_default(self) -> str:
        return _env("QUOTA_SPAWNER_HUB_ID")

    @default("hub_secret_file")
    def _hub_secret_file_default(self) -> str:
        return _env("QUOTA_SPAWNER_HUB_SECRET_FILE")

    @default("hub_prefix")
    def _hub_prefix_default(self) -> str:
        return _env("QUOTA_SPAWNER_PREFIX", "quota")

    @default("time_zone")
    def _time_zone_default(self) -> str:
        # checked here too: traitlets validates a default's type, not with @validate
        return _time_zone(_env("QUOTA_SPAWNER_USAGE_TZ", "UTC"))

    @validate("time_zone")
    def _valid_time_zone(self, proposal: dict[str, Any]) -> str:
        return _time_zone(str(proposal["value"]))

    @default("prewarm_interval")
    def _prewarm_interval_default(self) -> float:
        text = _env("QUOTA_SPAWNER_PREWARM_INTERVAL")
        try:
            return float(text) if text else 30.0
        except ValueError:
            log.warning("Pre-warm: QUOTA_SPAWNER_PREWARM_INTERVAL is not a number of "
                        "seconds; checking every 30s")
            return 30.0

    @validate("prewarm_interval")
    def _valid_prewarm_interval(self, proposal: dict[str, Any]) -> float:
        return max(0.5, float(proposal["value"]))

    @default("log_level")
    def _log_level_default(self) -> int:
        found = getattr(logging, _env("QUOTA_SPAWNER_USAGE_LOG_LEVEL", "INFO").upper(), None)
        return found if isinstance(found, int) else logging.INFO

    @property
    def tz(self) -> tzinfo:
        return timezone.utc if self.time_zone.upper() == "UTC" else ZoneInfo(self.time_zone)

    def event_hub_id(self) -> str:
        """The hub's id as the spawner derives it: hub_id, else from the hub's cookie
        secret file and prefix; read at each event, since the hub may write its secret
        after this service starts."""
        if self.hub_id:
            return self.hub_id
        found = (hub_id_from_secret_file(self.hub_prefix, self.hub_secret_file)
                 if self.hub_secret_file else None)
        return found or ""

    def setup(self, clock: Callable[[], float] = time.time) -> Setup:
        """What the handlers read, from the settings."""
        ledger = bool(self.usage_db) and self.usage_db != "none"
        # with a ledger, its events table only (and a file an admin names)
        events = events_path(self.state_dir, self.events_file, ledger)
        if not ledger and not events:
            log.warning("Requests: no usage ledger and no QUOTA_SPAWNER_STATE_DIR, so their "
                        "events are not recorded and nobody is told of them")
        reader = LedgerReader(self.usage_db)
        store = (lambda record: event_store.append_one(reader.engine(), record)
                 ) if ledger else None
        return Setup(
            reader=reader, prefix=self.service_prefix,
            quota_file=self.quota_file, quota_source=self.quota_source,
            quota_table_name=self.quota_table_name, quota_store=self.table_store(reader),
            state_dir=self.state_dir, tz=self.tz,
            documents=functools.partial(self.documents, reader, ledger), database=ledger,
            hub_base=self.hub_base_url, hub=HubApi(self.hub_api_url, self.hub_api_token),
            events=EventLog(events, log, store=store), hub_id=self.event_hub_id, clock=clock,
            templates=templates())

    def table_store(self, reader: LedgerReader) -> QuotaStore | None:
        """The table the pages read: the file's store, or the database table's on the
        service's own engine (seeded from the file while it has no version); None without
        a table."""
        if self.quota_source == DATABASE_SOURCE:
            seed = os.path.abspath(self.quota_file) if self.quota_file else ""
            return QuotaStore(DatabaseSource(reader.engine, self.quota_table_name, seed))
        return QuotaStore.for_path(self.quota_file) if self.quota_file else None

    def documents(self, reader: LedgerReader, ledger: bool) -> Documents | None:
        """The hub's and the watchdogs' documents (blocking): the ledger's rows, falling back
        to the state folder's files (a hub or watchdog without a ledger, or before the
        hub's upgrade); the folder alone until the ledger exists."""
        folder = FolderDocuments(self.state_dir) if self.state_dir else None
        if not ledger:
            return folder
        try:
            engine = reader.engine()
        except Exception:  # not made yet, or older than this code: the pages say so
            return folder
        return DatabaseDocuments(engine, self.event_hub_id(), fallback=folder)

    def web_app(self, clock: Callable[[], float] = time.time) -> web.Application:
        """The tornado app of every page and API, from the settings."""
        setup = self.setup(clock)
        return web.Application(routes(setup.prefix), cookie_secret=os.urandom(32),
                               usage=setup)

    def _find_my_config(self, cfg: Config) -> Any:
        # c.UsageService.x and --UsageService.x=…, the class's name before 0.2, still set
        # its settings, with a warning; its own section wins (spawner/common/moved.py)
        found = Config()
        for old in config_sections(type(self).__name__, cfg):
            found.merge(cfg[old])
        found.merge(super()._find_my_config(cfg))
        return found

    def initialize(self, argv: list[str] | None = None) -> None:
        self.parse_command_line(argv)
        logging.basicConfig(level=self.log_level, format=LOG_FORMAT)
        logging.getLogger("alembic").setLevel(logging.WARNING)  # its revision check, each start
        try:  # every setting read now: a wrong one is one sentence at start, not a traceback
            for name in self.class_trait_names(config=True):
                getattr(self, name)
        except TraitError as error:
            log.critical("The usage page does not start: %s.", str(error).rstrip("."))
            self.exit(2)

    def start(self) -> None:
        try:
            asyncio.run(self.serve())
        except KeyboardInterrupt:  # the hub stopping its services: not an error
            log.info("Usage page stopped")

    async def serve(self) -> None:
        app = self.web_app()
        setup: Setup = app.settings["usage"]
        Prewarmer(setup.hub, setup.reader, self.prewarm_interval).start()
        bind = urlparse(self.bind_url)
        # a body past inputs.MAX_BODY gets a 413 with a sentence; this cap ends the rest early
        server = HTTPServer(app, xheaders=True, max_body_size=inputs.MAX_BODY_HARD)
        server.listen(bind.port or 80, bind.hostname or "127.0.0.1")
        log.info("Usage page at %s, serving %s", bind.geturl(), setup.prefix)
        await asyncio.Event().wait()  # until the process is stopped


def routes(prefix: str) -> list[tuple[Any, ...]]:
    """Every page's and API's route under ``prefix``, the scripts and the OAuth callback."""
    return [
        *report.routes(prefix),
        *table.routes(prefix),
        *gpus.routes(prefix),
        *classes.routes(prefix),
        *requests.routes(prefix),
        (prefix + "static/(.*)", StaticFiles, {"path": str(STATIC)}),
        (prefix + "oauth_callback", HubOAuthCallbackHandler),
        (prefix.rstrip("/"), web.RedirectHandler, {"url": prefix}),
    ]


def make_app(*, clock: Callable[[], float] = time.time, **settings: Any) -> web.Application:
    """The tornado app for tests: ``settings`` are QuotaWebApp's (usage_db, quota_file,
    service_prefix, state_dir, hub_api_url, …); the others come from the environment,
    as in the service."""
    unknown = set(settings) - set(QuotaWebApp.class_trait_names(config=True))
    if unknown:  # traitlets would only warn of a misspelt setting
        raise TypeError(f"QuotaWebApp has no settings {sorted(unknown)}")
    return QuotaWebApp(**settings).web_app(clock)



def external_service(service: dict[str, Any], token: str) -> dict[str, Any]:
    """``webapp_service``'s service as one the hub does not start: the same name, URL and
    OAuth client, the process's token instead of its command and environment (it runs
    elsewhere, with ``external_environment``'s variables)."""
    kept = ("name", "url", "oauth_client_allowed_scopes", "oauth_no_confirm")
    return {**{k: service[k] for k in kept if k in service}, "api_token": token}


def external_environment(hub_url: str, api_url: str, token: str, *, name: str = "usage",
                         url: str = DEFAULT_URL, usage_db: str = "", hub_id: str = ""
                         ) -> dict[str, str]:
    """The variables a usage service the hub does not start needs: those the hub gives a
    managed service (JupyterHub's services/auth.py reads them), the ledger's URL and
    the hub's id. ``hub_url``: the hub's public URL; ``api_url``: its API as this service
    reaches it (…/hub/api)."""
    prefix = f"/services/{name}/"
    found = {
        "JUPYTERHUB_SERVICE_NAME": name, "JUPYTERHUB_API_TOKEN": token,
        "JUPYTERHUB_API_URL": api_url, "JUPYTERHUB_BASE_URL": "/",
        "JUPYTERHUB_SERVICE_PREFIX": prefix, "JUPYTERHUB_SERVICE_URL": url,
        "JUPYTERHUB_CLIENT_ID": f"service-{name}",
        "JUPYTERHUB_OAUTH_CALLBACK_URL": f"{prefix}oauth_callback",
        "JUPYTERHUB_OAUTH_ACCESS_SCOPES": json.dumps([f"access:services!service={name}"]),
        "JUPYTERHUB_PUBLIC_URL": hub_url,
    }
    if usage_db:
        found["QUOTA_SPAWNER_USAGE_DB"] = usage_db
    if hub_id:
        found["QUOTA_SPAWNER_HUB_ID"] = hub_id
    return found


main = QuotaWebApp.launch_instance


# --- the hub config's side ---------------------------------------------------------------


def webapp_service(public_url: str, usage_db: str, quota_file: str, name: str = "usage",
                  url: str = DEFAULT_URL, state_dir: str = "", secret_file: str = "",
                  prefix: str = "quota", quota_source: str = "", quota_table_name: str = "",
                  hub_id: str = "") -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The managed service, for c.JupyterHub.services, and two roles for load_roles:
    that of those who may see everything without being admins (no one until a config
    lists them), and the service's own (users, their groups and their servers' roles,
    for the table editor's preview and the role requests; the hub config adds the
    classes' servers, for scheduled pre-warms).

    The hub proxies ``/services/<name>/`` to ``url`` and lists it in its Services menu
    for everyone who holds access to it: with the shipped config, every user, since
    anyone may ask for a bigger role there; its pages check who may see what.

    ``state_dir``: the spawner's (the host map's files; without a ledger, the event log's
    file, where requests for a role append their events); ``secret_file`` and
    ``prefix``: the hub's id for those events, as
    the spawner derives it (unless QUOTA_SPAWNER_HUB_ID is set, or ``hub_id`` gives the
    id the config sets: the rows of the host map are keyed by it). ``quota_source`` and
    ``quota_table_name``: the spawner's, so that the editor and the pages use the table
    the hub reads (empty: the hub's variables, when set).
    """
    environment = {
        "QUOTA_SPAWNER_USAGE_DB": usage_db,
        "QUOTA_SPAWNER_QUOTA_FILE": quota_file,
        "JUPYTERHUB_PUBLIC_URL": public_url,
    }
    if state_dir:
        environment["QUOTA_SPAWNER_STATE_DIR"] = state_dir
    for passed in PASSED_ON:
        if os.environ.get(passed):
            environment[passed] = os.environ[passed]
    environment.update(hub_id_environment(
        hub_id or environment.get("QUOTA_SPAWNER_HUB_ID", ""), secret_file, prefix))
    if quota_source:
        environment["QUOTA_SPAWNER_QUOTA_SOURCE"] = quota_source
    if quota_table_name:
        environment["QUOTA_SPAWNER_QUOTA_TABLE_NAME"] = quota_table_name
    service = {
        "name": name,
        "url": url,
        "command": [sys.executable, "-m", "spawner.webapp"],
        "environment": environment,
        # the user model the page gets carries the usage scope, filtered to the user's
        # classes; admins are told by the model's admin field
        "oauth_client_allowed_scopes": [SCOPE],
        # run by the hub's admin: logging in to it asks nobody for a confirmation
        "oauth_no_confirm": True,
    }
    role = {
        "name": f"{name}-viewer",
        "description": "See every session on the usage page without being an admin",
        "scopes": [SCOPE, f"access:services!service={name}"],
        "users": [],
    }
    own = {
        "name": f"{name}-service",
        "description": "Read the users, their groups and their servers, for the quota "
                       "table editor's preview and role requests",
        "scopes": list(SERVICE_SCOPES),
        "services": [name],
    }
    return service, role, own


def __getattr__(name: str) -> Any:
    # UsageService and usage_service, this module's names before 0.2 (common/moved.py)
    return moved_name(__name__, name)
