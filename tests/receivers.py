"""Real local receivers for the watchdog's channels: an SMTP server and an HTTP server.

The HTTP server answers as Feishu, Lark and DingTalk bots do, and checks
their signatures as those services document them:

- Feishu and Lark (POST /open-apis/bot/v2/hook/<token>): the JSON body's
  ``timestamp`` (epoch seconds, within an hour of now) and ``sign`` =
  base64(HMAC-SHA256(key="<timestamp>\\n<secret>", msg=b"")). A refusal is
  HTTP 200 with a non-zero ``code``, as Feishu answers.
- DingTalk (POST /robot/send?access_token=<token>&timestamp=<ms>&sign=<s>):
  ``sign``, once the query is decoded, = base64(HMAC-SHA256(key=secret,
  msg="<timestamp>\\n<secret>")), the timestamp within an hour of now. A
  refusal is HTTP 200 with ``errcode`` 310000 ("sign not match").
- Anything else is a JSON webhook (apprise's json://): recorded as it came.

Each receiver can be made slow (``delay``) or failing (``fail_first``) per path.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from aiosmtpd.controller import Controller

from harness import free_port

SIGNATURE_WINDOW = 3600  # both services refuse a timestamp more than an hour off


def feishu_expected(timestamp: str, secret: str) -> str:
    key = f"{timestamp}\n{secret}".encode()
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()


def dingtalk_expected(timestamp: str, secret: str) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}\n{secret}".encode(), hashlib.sha256)
    return base64.b64encode(mac.digest()).decode()


@dataclass
class Request:
    kind: str  # "feishu", "dingtalk" or "json"
    path: str
    query: dict[str, list[str]]
    body: Any  # the parsed JSON, or the raw bytes
    accepted: bool
    reason: str = ""


@dataclass
class HttpReceiver:
    """A threaded HTTP server on 127.0.0.1; use as a context manager."""

    feishu_secrets: dict[str, str] = field(default_factory=dict)  # token -> secret
    dingtalk_secrets: dict[str, str] = field(default_factory=dict)
    delay: dict[str, float] = field(default_factory=dict)  # path prefix -> seconds
    fail_first: dict[str, int] = field(default_factory=dict)  # path prefix -> HTTP 500s

    def __post_init__(self) -> None:
        self.requests: list[Request] = []
        self._lock = threading.Condition()
        self._server: ThreadingHTTPServer | None = None

    @property
    def base(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> HttpReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                status, answer = receiver._handle(self.path, raw)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except OSError:  # the client gave up (a timeout test)
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    def _record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)
            self._lock.notify_all()

    def _handle(self, target: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        parts = urlsplit(target)
        path, query = parts.path, parse_qs(parts.query)
        for prefix, seconds in self.delay.items():
            if path.startswith(prefix):
                time.sleep(seconds)
        for prefix, count in self.fail_first.items():
            if path.startswith(prefix) and count > 0:
                self.fail_first[prefix] = count - 1
                self._record(Request("failed", path, query, raw, False, "HTTP 500 on purpose"))
                return 500, {"error": "on purpose"}
        try:
            body: Any = json.loads(raw or b"null")
        except ValueError:
            body = raw
        if path.startswith("/open-apis/bot/v2/hook/"):
            return self._feishu(path, query, body)
        if path == "/robot/send":
            return self._dingtalk(path, query, body)
        self._record(Request("json", path, query, body, True))
        return 200, {}

    def _feishu(self, path: str, query: dict[str, list[str]],
                body: Any) -> tuple[int, dict[str, Any]]:
        token = path.rsplit("/", 1)[-1]
        secret = self.feishu_secrets.get(token)
        reason = ""
        if not isinstance(body, dict) or body.get("msg_type") != "text" \
                or not isinstance(body.get("content"), dict):
            reason = "not a text message"
        elif secret is not None:
            timestamp, sign = str(body.get("timestamp", "")), str(body.get("sign", ""))
            if not timestamp.isdigit() or abs(time.time() - int(timestamp)) > SIGNATURE_WINDOW:
                reason = "timestamp is not within one hour from current time"
            elif not hmac.compare_digest(sign, feishu_expected(timestamp, secret)):
                reason = "sign match fail"
        self._record(Request("feishu", path, query, body, not reason, reason))
        if reason:
            return 200, {"code": 19021, "msg": reason, "data": {}}
        return 200, {"code": 0, "msg": "success", "data": {}}

    def _dingtalk(self, path: str, query: dict[str, list[str]],
                  body: Any) -> tuple[int, dict[str, Any]]:
        token = (query.get("access_token") or [""])[0]
        secret = self.dingtalk_secrets.get(token)
        reason = ""
        if not isinstance(body, dict) or body.get("msgtype") != "text":
            reason = "not a text message"
        elif secret is not None:
            timestamp = (query.get("timestamp") or [""])[0]
            sign = (query.get("sign") or [""])[0]  # parse_qs decoded it once, as a server does
            if not timestamp.isdigit() \
                    or abs(time.time() * 1000 - int(timestamp)) > SIGNATURE_WINDOW * 1000:
                reason = "invalid timestamp"
            elif not hmac.compare_digest(sign, dingtalk_expected(timestamp, secret)):
                reason = "sign not match"
        self._record(Request("dingtalk", path, query, body, not reason, reason))
        if reason:
            return 200, {"errcode": 310000, "errmsg": reason}
        return 200, {"errcode": 0, "errmsg": "ok"}

    def wait(self, count: int, timeout: float = 10.0, **match: Any) -> list[Request]:
        """The first ``count`` requests whose attributes equal ``match``; AssertionError else."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                found = [r for r in self.requests
                         if all(getattr(r, k) == v for k, v in match.items())]
                if len(found) >= count:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{len(found)} of {count} requests like {match} "
                                         f"came; all: {self.requests}")
                self._lock.wait(left)


class _Mailbox:
    def __init__(self) -> None:
        self.messages: list[tuple[str, list[str], Message]] = []
        self.lock = threading.Condition()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        with self.lock:
            self.messages.append((envelope.mail_from, list(envelope.rcpt_tos),
                                  message_from_bytes(envelope.original_content)))
            self.lock.notify_all()
        return "250 OK"


class SmtpReceiver:
    """aiosmtpd on 127.0.0.1 and a free port, plain SMTP; use as a context manager."""

    def __init__(self) -> None:
        self.port = free_port()
        self._box = _Mailbox()
        self._controller = Controller(self._box, hostname="127.0.0.1", port=self.port)

    def __enter__(self) -> SmtpReceiver:
        self._controller.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._controller.stop()

    def url(self, to: str = "admin@example.org", sender: str = "watchdog@example.org") -> str:
        """apprise's URL for this server: plain SMTP (mode=insecure), no login."""
        return f"mailto://127.0.0.1:{self.port}?from={sender}&to={to}&mode=insecure"

    def wait(self, count: int, timeout: float = 10.0) -> list[tuple[str, list[str], Message]]:
        deadline = time.monotonic() + timeout
        with self._box.lock:
            while len(self._box.messages) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{len(self._box.messages)} of {count} mails came")
                self._box.lock.wait(left)
            return list(self._box.messages)


def refused_url_base() -> str:
    """An http base where nothing listens: the connection is refused."""
    return f"http://127.0.0.1:{free_port()}"
