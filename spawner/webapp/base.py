"""The two handlers every page and API of the web app extends, and what they share.

``PageHandler`` (HTML, rendered from ``templates/``) and ``ApiHandler`` (JSON in and out)
both extend ``BaseHandler``: the hub's OAuth (``HubOAuthenticated``; the user model is
fetched without blocking the loop), the body size limit, the hardening headers with the
Content-Security-Policy, and refusals as sentences. A handler refuses by raising
``access.Refused`` (or ``inputs.BadInput``, ``reader.NotReady``), whose sentence a page
shows in ``message.html`` and an API sends as ``{"message": sentence}``; an error without
a sentence gets the handler's own for its status (``refused``, ``missing``, ``unreadable``,
``failed``).

Cross-site requests: JupyterHub's ``HubOAuth`` accepts the login cookie on anything
but a page's GET only with the service's XSRF token in ``X-XSRFToken`` (the pages carry
it, ``xsrf()``); without it the request has no user and is refused. An API's POST must
also be JSON (``body``), which a form of another site cannot send without a CORS
preflight this service never answers.

Each page is drawn here, once: a page that stays live (the host map, a class's dashboard)
has its script ask the page's API for the page again, as HTML (``Accept: text/html``
only: ``ApiHandler.wants_html``, ``reply_html``), and patch what changed into the page in
place (``static/live.js``). Every other client of the API gets JSON.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import tzinfo
from functools import cache
from importlib.resources import files
from typing import Any, TypeVar

import jinja2
from jupyterhub.services.auth import HubOAuthenticated
from tornado import web

from spawner.quota.store import QuotaStore
from spawner.usage.documents import Documents
from spawner.usage.event_log import EventLog
from spawner.webapp import inputs
from spawner.webapp.access import REFUSED, Refused, is_admin, nav_for
from spawner.webapp.formatting import FILTERS
from spawner.webapp.hub_api import HubApi
from spawner.webapp.reader import LedgerReader

T = TypeVar("T")
log = logging.getLogger("quota_spawner.usage")

# The pages allow nothing from elsewhere; those with a script run this service's only
# and talk to this service only.
CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
       "form-action 'self'; frame-ancestors 'self'; base-uri 'none'")
SCRIPT_CSP = ("default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; "
              "img-src 'self' data:; connect-src 'self'; form-action 'self'; "
              "frame-ancestors 'self'; base-uri 'none'")
HARDENING = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
             "Referrer-Policy": "same-origin"}
STATIC = files(__package__).joinpath("static")
FORMAT_SCRIPT = "format.js"  # the formatters a page script still needs (formatting.py's)
LIVE_SCRIPT = "live.js"  # a live page's drawing, asked again and patched in (reply_html)


@dataclass(frozen=True)
class Setup:
    """What the handlers read, made once by the Application from its settings."""

    reader: LedgerReader  # the ledger and the files, on worker threads
    prefix: str  # the service's URL prefix, ending in /
    quota_file: str  # "" when the hub gave none
    # where the table lives: "file", or "database" (the ledger's versions of the table
    # quota_table_name, quota_file their first seed); the store the pages read it from
    quota_source: str
    quota_table_name: str
    quota_store: QuotaStore | None  # None: no table
    state_dir: str  # the hub's state folder; "" when not given
    # the hub's and the watchdogs' documents (spawner/usage/documents.py; blocking, None:
    # neither the ledger nor the state folder), and whether they are the database's rows
    documents: Callable[[], Documents | None]
    database: bool
    tz: tzinfo  # the days and times of the pages
    hub_base: str  # the hub's base URL, for links to the hub and to servers
    hub: HubApi
    events: EventLog  # the hub's event log, for role requests' changes
    hub_id: Callable[[], str]  # the hub's id, for those events
    clock: Callable[[], float]  # now, in epoch seconds
    templates: jinja2.Environment


def templates() -> jinja2.Environment:
    """The pages' templates: autoescaped, undefined names an error, formatting's filters."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(files(__package__).joinpath("templates"))),
        autoescape=True, trim_blocks=True, lstrip_blocks=True,
        undefined=jinja2.StrictUndefined)
    env.filters.update(FILTERS)
    return env


@cache
def static_version(name: str) -> str:
    """A static file's hash, in its URL, so a browser never runs an old one from its cache."""
    return hashlib.sha256(STATIC.joinpath(name).read_bytes()).hexdigest()[:12]


def static_url(prefix: str, name: str) -> str:
    return f"{prefix}static/{name}?v={static_version(name)}"


class StaticFiles(web.StaticFileHandler):
    """``{prefix}static/``: the pages' scripts, nothing else allowed, typed as scripts."""

    def set_default_headers(self) -> None:
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Content-Security-Policy", "default-src 'none'")

    def get_content_type(self) -> str:
        if self.absolute_path.endswith(".js"):
            return "text/javascript; charset=utf-8"
        if self.absolute_path.endswith(".txt"):
            return "text/plain; charset=utf-8"
        return super().get_content_type()


class BaseHandler(HubOAuthenticated, web.RequestHandler):
    """The hub's OAuth, the headers, the refusals' sentences; the service's setup."""

    # Sentences for an error that carries none, by status: 403 is HubOAuthenticated
    # refusing a visitor without access to the service.
    refused = REFUSED
    missing = "There is no such endpoint here."
    unreadable = "The request could not be read."
    failed = "The request failed because of an error; the service's log has the details."
    # the visitor as get_current_user found them (None: not yet, or nobody)
    known_user: dict[str, Any] | None = None

    @property
    def setup(self) -> Setup:
        return self.settings["usage"]

    @property
    def reader(self) -> LedgerReader:
        return self.setup.reader

    @property
    def tz(self) -> tzinfo:
        return self.setup.tz

    @property
    def prefix(self) -> str:
        return self.setup.prefix

    def decode_argument(self, value: bytes, name: str | None = None) -> str:
        # a query's or a path's argument: text, or a sentence naming it (tornado's own
        # answer is a bare 400)
        return inputs.argument(value, name)

    async def prepare(self) -> None:
        inputs.check_body_size(len(self.request.body or b""))
        # fetch the user model without blocking the loop; current_user then reads the cache
        await self.hub_auth.get_user(self, sync=False)

    def get_current_user(self) -> dict[str, Any] | None:
        # HubOAuthenticated's, kept for the error page, which must not ask the hub again
        self.known_user = super().get_current_user()
        return self.known_user

    def policy(self) -> str:
        """The Content-Security-Policy: nothing from elsewhere, no script."""
        return CSP

    def set_default_headers(self) -> None:
        self.set_header("Content-Security-Policy", self.policy())
        for name, value in HARDENING.items():
            self.set_header(name, value)

    def who(self) -> str:
        return str(self.current_user["name"])

    def require_admin(self, sentence: str, what: str) -> str:
        """The admin's name, or Refused with ``sentence``: only ``admin`` true counts,
        not the usage page's scopes, for what shows or changes everyone's servers."""
        model = self.current_user
        if not is_admin(model):
            log.info("%s: refused %s, not an admin", what, model.get("name"))
            raise Refused(sentence)
        return str(model["name"])

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the service's worker threads (files, the quota table)."""
        return await self.reader.call(fn, *args)

    def xsrf(self) -> str:
        """The XSRF token the page's script sends back as X-XSRFToken, as text."""
        token = self.xsrf_token
        return token.decode() if isinstance(token, bytes) else str(token)

    def draw(self, template: str, block: str | None = None, **values: Any) -> str:
        """``template`` (or only its ``block``) with ``values`` and what every page has: the
        service's frame (prefix, who, the header's links, the time zone)."""
        model = self.known_user or {}  # an error page must not ask the hub again
        found = self.setup.templates.get_template(template)
        values = dict(
            prefix=self.prefix, hub_home=self.setup.hub_base.rstrip("/") + "/hub/home",
            who=model.get("name", ""), nav=nav_for(model, self.prefix),
            here=self.request.path, tz=self.tz, tz_name=str(self.tz), **values)
        if block is None:
            return found.render(values)
        return "".join(found.blocks[block](found.new_context(values)))

    def sentence_for(self, status_code: int, **kwargs: Any) -> str:
        """The sentence of the error being written: its own, else this handler's."""
        error = kwargs.get("exc_info", (None, None, None))[1]
        sentence = getattr(error, "sentence", None)  # Refused, BadInput, NotReady
        if sentence:
            return str(sentence)
        return {403: self.refused, 404: self.missing, 400: self.unreadable}.get(
            status_code, self.failed)


class PageHandler(BaseHandler):
    """A page: rendered from a template in the service's frame (``base.html``)."""

    page_title = "Usage"  # what a refusal of this page is titled
    scripts: tuple[str, ...] = ()  # static/ files the page runs, in order
    missing = "There is no such page here."
    unreadable = "The page was asked for with arguments it cannot read."
    failed = ("The page could not be shown because of an error; the service's log has the "
              "details.")

    def policy(self) -> str:
        return SCRIPT_CSP if self.scripts else CSP

    def render_page(self, template: str, status: int = 200, **values: Any) -> None:
        values.setdefault("scripts", [static_url(self.prefix, name) for name in self.scripts])
        self.set_status(status)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(self.draw(template, **values))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        # a refusal is a sentence, without the page's scripts
        self.render_page("message.html", status=status_code, title=self.page_title,
                         sentence=self.sentence_for(status_code, **kwargs), scripts=[])


class ApiHandler(BaseHandler):
    """A JSON endpoint: JSON bodies in, JSON out, refusals as ``{"message": sentence}``."""

    def set_default_headers(self) -> None:
        super().set_default_headers()
        self.set_header("Content-Type", "application/json; charset=utf-8")

    def body(self, *required: str) -> dict[str, Any]:
        """The request's JSON object, with ``required`` strings in it; else a 400."""
        kind = self.request.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise Refused("Send the request as JSON (Content-Type: application/json).", 400)
        found = inputs.parse_json(self.request.body or b"")
        if not isinstance(found, dict):
            raise Refused("The request must be a JSON object.", 400)
        for name in required:
            if not isinstance(found.get(name), str):
                raise Refused(f"The request needs {name!r}, as a string.", 400)
        return found

    def reply(self, value: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(value, default=str))

    def wants_html(self) -> bool:
        """Asked for HTML only (``Accept: text/html``): a live page's script, which patches
        the page as drawn here into itself. A browser's navigation accepts more (``*/*``),
        and a script or ``curl`` asks for JSON or anything: they get JSON."""
        accept = self.request.headers.get("Accept", "")
        return [t.split(";")[0].strip().lower() for t in accept.split(",")] == ["text/html"]

    def reply_html(self, template: str, **values: Any) -> None:
        """The page's ``main`` block as its page handler draws it (``wants_html``)."""
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(self.draw(template, "main", **values))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps({"message": self.sentence_for(status_code, **kwargs)}))
