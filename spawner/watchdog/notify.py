"""The watchdog's messages and the channels they go to.

An event of the rules ("open", "remind" or "resolve" of one incident) becomes
one plain-text message (``format_message``): who (user, role, image), where
(the server's link, GPU index and UUID, host), what (used, limit, percent,
for how long) and what to do. ``Notifier`` sends it to every channel whose
routing takes it (``routes``), each channel in its own thread with a timeout
and retries, so a dead or slow channel never holds up or fails the others.

Channels are URLs. apprise sends most of them (``mailto://``, ``wecombot://``,
``slack://``, ``json://``, ``jsons://`` and every other apprise scheme). Three
are sent here, because apprise cannot sign them as the services document:

- ``feishu://<token>[/<secret>]`` posts to
  https://open.feishu.cn/open-apis/bot/v2/hook/<token>, and
  ``lark://<token>[/<secret>]`` to https://open.larksuite.com/open-apis/bot/v2/hook/<token>,
  with ``timestamp`` (epoch seconds) and ``sign`` = base64(HMAC-SHA256 keyed
  with "<timestamp>\\n<secret>" over an empty message) in the JSON body.
- ``dingtalk://[<secret>@]<token>`` (apprise's own form) posts to
  https://oapi.dingtalk.com/robot/send?access_token=<token> with ``timestamp``
  (epoch milliseconds) and ``sign`` = base64(HMAC-SHA256 keyed with the secret
  over "<timestamp>\\n<secret>") as query parameters, URL-encoded once. apprise
  2.3's DingTalk plugin encodes ``sign`` twice (it quotes it, then requests
  quotes the ``%``), which DingTalk answers with "sign not match"; and it takes
  DingTalk's HTTP 200 with a non-zero ``errcode`` for success.

These three take ``?base=<scheme://host[:port][/prefix]>`` to post somewhere
else than the service's own host (an HTTP proxy that forwards paths, or a
test receiver): ``feishu://TOKEN/SECRET?base=http://127.0.0.1:8080`` posts to
http://127.0.0.1:8080/open-apis/bot/v2/hook/TOKEN. All three check the reply's
``code``/``errcode``, since these services answer refusals with HTTP 200.

Logs name a channel by its ``name`` and never show its URL: the URL holds
the tokens and secrets.

One user cannot flood others' channels (``user_message_limit``, limits.py): a channel
gets at most 5 messages about one user in an hour, and one digest of the rest when the
hour ends (``send_digests``, each cycle). A channel that names the user in its ``users``
is theirs and gets every message about them, so the answer to their own request always
reaches them. Every message, sent or held, is in the watchdog's log.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

import requests
from traitlets import Dict, Float, Integer, List, TraitError, Unicode, default, validate
from traitlets.config import LoggingConfigurable

from spawner.quota.units import format_human
from spawner.usage.events import BudgetEvent, HubEvent, RoleRequestAsked
from spawner.watchdog import disk_words
from spawner.watchdog.disk_words import DISK_RULES, HOME_DISK
from spawner.watchdog.hub_words import Words, word
from spawner.watchdog.limits import MessageLimits, Window
from spawner.watchdog.rules import (
    BUDGET,
    GPU_IDLE,
    GPU_MEMORY,
    INSTANT_RULES,
    MEMORY,
    PREEMPTION,
    ROLE_REQUEST,
    ZOMBIE,
    Event,
    Incident,
)
from spawner.watchdog.text import day_and_time, duration, name, one_line, utc

GroupsOf = Callable[[str], list[str]] | Mapping[str, list[str]]

KINDS = ("open", "remind", "resolve")
# Incidents that only admin channels get by default: waste and stray containers
# are for whoever runs the host, not for a class's instructor.
ADMIN_ONLY_RULES = (GPU_IDLE, ZOMBIE)
_BYTE_RULES = (GPU_MEMORY, MEMORY)  # value and limit in bytes

# --- the message ---------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    title: str
    body: str

    @property
    def text(self) -> str:
        """Title and body as one text, for the services without a title field."""
        return f"{self.title}\n\n{self.body}"


def server_url(hub_url: str, user: str) -> str:
    """The user's server on the hub: <hub_url>/user/<name>/, the name URL-quoted."""
    return f"{hub_url.rstrip('/')}/user/{quote(user, safe='')}/"


def _percent(incident: Incident) -> float | None:
    if incident.percent is not None:
        return float(incident.percent)
    if incident.value is not None and incident.limit:
        return 100.0 * float(incident.value) / float(incident.limit)
    return None


def _index(incident: Incident) -> int | None:
    """The GPU's index, when NVML said it: -1 is NVML's "not seen" (spawner.gpu.nvml)."""
    index = incident.gpu_index
    return index if isinstance(index, int) and index >= 0 else None


def _gpu_name(incident: Incident) -> str:
    """'GPU 2'; a GPU whose index NVML did not say by its UUID: admins can look that up."""
    index, uuid = _index(incident), incident.gpu_uuid
    if index is not None:
        return f"GPU {index}"
    if uuid:
        return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU {uuid}"
    return "a GPU"


def _gpu(incident: Incident) -> str:
    """The GPU line: its index and UUID, or its UUID and that its index is unknown."""
    index, uuid = _index(incident), incident.gpu_uuid
    if index is None and not uuid:
        return ""
    if index is None:
        return f"{uuid} (its index is unknown: NVML does not see it)"
    return f"GPU {index}" + (f" ({uuid})" if uuid else "")


def hub_event(incident: Incident) -> HubEvent | None:
    """The hub's event an incident tells (rules preemption, budget and role_request), read
    from the facts it keeps; None for the watchdog's own incidents."""
    return HubEvent.from_json(incident.hub_event) if incident.hub_event else None


def _told(incident: Incident, now: float) -> Words | None:
    """The hub's event of the incident in words (hub_words.py); None for the watchdog's own
    incidents."""
    event = hub_event(incident)
    return word(event, now) if event is not None else None


def _headline(incident: Incident, told: Words | None, numbers: bool = True) -> str:
    """The title's subject, without the kind; ``numbers``: with the percent; ``told``:
    the hub's event in words, for the incidents that tell one."""
    server = incident.server
    user = name(server.user) if server else None
    percent = _percent(incident)
    pct = f" at {percent:.0f}%" if percent is not None and numbers else ""
    of = " of its limit" if pct else " high"
    gpu = _gpu_name(incident)
    rule = incident.rule
    if rule in DISK_RULES:
        return disk_words.subject(incident, numbers)
    if rule == "gpu_memory":
        return f"{user}'s GPU memory{pct}{of}" if user else f"GPU memory{pct}{of}"
    if rule == "memory":
        return f"{user}'s container memory{pct}{of}" if user else f"container memory{pct}{of}"
    if rule == "oom":
        return f"{user}'s server: a process was killed, out of memory" if user \
            else "a process was killed, out of memory"
    if rule == "gpu_lost":
        return f"{gpu} lost" + (f" under {user}'s server" if user else "")
    if rule == "xid":
        code = f" {int(incident.value)}" if incident.value is not None else ""
        return f"{gpu} reported XID error{code}" + (f" under {user}'s server" if user else "")
    if rule == GPU_IDLE:
        return f"{gpu} reserved by {user} is idle" if user else f"{gpu} reserved and idle"
    if rule == "zombie":
        container = name(server.name) if server else "a container"
        return f"container {container} holds GPUs but no hub server claims it"
    if told is not None:
        return told.subject
    return incident.what or rule


def _numbers(incident: Incident) -> str | None:
    """Used, limit and percent of the memory rules, in human units."""
    if incident.rule not in _BYTE_RULES or incident.value is None:
        return None
    if incident.rule == "gpu_memory":
        shared = incident.server is not None and incident.server.shared_gpu
        kind, of = "GPU memory", " of its GPU memory cap" if shared else " of the card"
    else:
        kind, of = "Container memory (working set)", " of its limit"
    used = format_human(int(incident.value))
    limit = f"{of}, {format_human(int(incident.limit))}" if incident.limit else ""
    percent = _percent(incident)
    pct = f" ({percent:.0f}%)" if percent is not None else ""
    return f"{kind} {used}{pct}{limit}"


def _what(incident: Incident, duration: str) -> str:
    """What is wrong: the numbers and for how long, or the rules' own sentence."""
    numbers = _numbers(incident)
    if numbers:
        return f"{numbers}, for {duration}."
    if incident.rule == GPU_IDLE:
        return f"No GPU utilisation for {duration}."
    if incident.what:
        return incident.what
    if incident.rule == "oom":
        count = int(incident.value) if incident.value else 1
        killed = "1 process" if count == 1 else f"{count} processes"
        return f"The kernel's OOM killer ended {killed}."
    if incident.rule == "zombie":
        return "The container holds GPUs but no hub server claims it."
    return incident.rule


# What to do, by rule, for the open and remind messages.
ADVICE = {
    "gpu_memory": (
        "Save your work; free GPU memory (del tensors you no longer need, then "
        "torch.cuda.empty_cache()), use smaller batches, or ask for a larger role. "
        "At the limit the next allocation fails with CUDA out of memory."),
    "memory": (
        "Save your work; free memory (del large objects, shut down kernels you do not use, "
        "load data in chunks) or ask for a larger role. At the limit the kernel is killed."),
    "oom": (
        "A kernel or job was killed and unsaved work in it is lost: restart it with less "
        "memory (smaller batches, data in chunks) or ask for a larger role."),
    "gpu_lost": (
        "Admins: drain the host, check dmesg and nvidia-smi, and reset or replace the GPU. "
        "Users on it: save what you can; the server needs a restart."),
    # a lost GPU whose index NVML did not say: NVML itself may be what is broken
    "gpu_unseen": (
        "Admins: NVML does not see this GPU. On the host, check that the NVIDIA driver is "
        "loaded and sees it (nvidia-smi, nvidia-smi -L | grep <UUID>, dmesg | grep -i "
        "nvrm); with compose, the watchdog service's GPU reservation too. If nvidia-smi "
        "does not list it either, drain the host and reset or replace the GPU. Users on "
        "it: save what you can; the server may need a restart."),
    "xid": (
        "Admins: look the XID code up in NVIDIA's XID catalogue and dmesg; some need a GPU "
        "reset. Users: if your job failed, restart it."),
    "gpu_idle": (
        "Stop the server if the GPU is no longer needed, so that others can use it; "
        "admins may stop it from the hub's admin page."),
    "zombie": (
        "Admins: check that nobody uses the container, then remove it "
        "(docker rm -f <name>) to free its GPUs."),
}


def _advice(incident: Incident, told: Words | None) -> str | None:
    if told is not None:
        return told.advice
    if incident.rule in DISK_RULES:
        return disk_words.advice(incident)
    if incident.rule == "gpu_lost" and _index(incident) is None:
        return ADVICE["gpu_unseen"]
    return ADVICE.get(incident.rule)


def format_message(event: Event, hub_url: str, host: str, now: float | None = None) -> Message:
    """The plain-text title and body of one event: no HTML. Never raises for odd values.

    ``host`` names the host when the incident does not. Names are shown bare when
    plain, else quoted; the title and each line are one line whatever they hold
    (``text.py``), so nothing a user typed can pass for one of the message's lines.
    """
    incident = event.incident
    now = time.time() if now is None else now
    told = _told(incident, now)
    if event.kind == "resolve":
        ended = incident.resolved if incident.resolved is not None else now
        lasted = duration(ended - incident.since)
        title = (f"[resolved] {_headline(incident, told, numbers=False)}: resolved after "
                 f"{lasted}")
    elif event.kind == "remind":
        lasted = duration(now - incident.since)
        title = f"[{incident.severity}] still: {_headline(incident, told)}, for {lasted}"
    else:
        lasted = duration(now - incident.since)
        title = f"[{incident.severity}] {_headline(incident, told)}"
    server = incident.server
    lines = []
    if event.kind == "resolve":
        why = (getattr(incident, "reason", "") or "it no longer applies").rstrip(".")
        lines.append(f"Resolved after {lasted}: {why}.")
    elif event.kind == "remind":
        lines.append(f"Still going on: {_what(incident, lasted)}")
    else:
        lines.append(f"What: {_what(incident, lasted)}")
    if told is not None and told.when:
        lines.append(f"When: {told.when}")
    if incident.rule == ROLE_REQUEST:  # about a user and a role, not a server
        lines.extend(told.lines if told is not None else ())
        server = None
    if server is not None:
        # a stopped server's image is not known (its event does not say)
        image = f", image {name(server.image)}" if server.image else ""
        role = name(server.role) if server.role else "?"
        lines.append(f"Who: {name(server.user)} (role {role}{image})")
        lines.append(f"Server: {server_url(hub_url, server.user)}")
        if server.name:
            lines.append(f"Container: {name(server.name)}")
    gpu = _gpu(incident)
    if gpu:
        lines.append(f"GPU: {gpu}")
    elif incident.rule == PREEMPTION:  # several, or a stopped server's: as the hub names them
        gpus = (told.gpus if told is not None else ()) or (server.gpus if server else ())
        if gpus:
            lines.append(f"GPUs: {', '.join(name(g) for g in gpus)}")
    lines.append(f"Host: {getattr(incident, 'host', '') or host}")
    since = utc(incident.since)
    if incident.rule in (*INSTANT_RULES, PREEMPTION, BUDGET, ROLE_REQUEST, "test"):
        lines.append(f"At: {since}")
    else:
        lines.append(f"Since: {since} ({lasted})")
    if event.kind != "resolve":
        advice = _advice(incident, told)
        if advice:
            lines.append(f"What to do: {advice}")
    lines.append(f"Incident: {incident.key}")
    return Message(title=one_line(title), body="\n".join(one_line(line) for line in lines))


# --- one user's many messages ----------------------------------------------------------

DIGEST = "digest"  # the rule of a digest's incident (in the log and on channels)


def about(incident: Incident) -> str:
    """The user a message is about (their server's, or who asked for a role); "" for
    none (a GPU or a host, or a container no server claims)."""
    if incident.rule == ZOMBIE or incident.server is None:
        return ""
    return incident.server.user


def limited(channel: Mapping[str, Any], user: str) -> bool:
    """Whether ``channel``'s messages about ``user`` count against the limit: not on a
    channel that names the user (theirs: what they did is told to them, and the
    decisions on their requests always reach them)."""
    return user not in (channel.get("users") or ())


def kind_of(event: Event) -> str:
    """What a message is, for a digest: the hub's event ("role-request", "preempted"),
    else the rule, with "reminder" or "resolved" for the follow-ups."""
    incident = event.incident
    hub_event = incident.hub_event.get("event") if incident.hub_event else None
    kind = hub_event if isinstance(hub_event, str) and hub_event else incident.rule
    follow_up = {"remind": " reminder", "resolve": " resolved"}.get(event.kind, "")
    return one_line(kind) + follow_up


def digest_key(user: str) -> str:
    return f"{DIGEST}:{user}"


def digest_message(window: Window, host: str, limit: int, period: float,
                   now: float) -> Message:
    """The digest of one window: how many messages about its user were held for this
    channel, of which kinds, and where to read them."""
    count = window.held_count
    user = name(window.user)
    kinds = ", ".join(f"{n} {kind}" for kind, n in
                      sorted(window.held.items(), key=lambda item: (-item[1], item[0])))
    messages = f"{count} message{'' if count == 1 else 's'}"
    title = (f"[info] {messages} about {user} held: over {limit} in "
             f"{duration(period)}")
    came = window.sent + count
    lines = [
        f"What: From {day_and_time(window.start)} to "
        f"{day_and_time(window.start + period)}, {came} messages about {user} came for "
        f"this channel; the first {window.sent} were sent and these {count} held: {kinds}.",
        f"Who: {user}",
        f"Host: {host}",
        f"At: {utc(now)}",
        "What to do: Each held message is in the watchdog's log in full. The usage "
        "service's requests page lists the user's role requests, and the quota table's "
        "requests: max_open limits how many may wait.",
        f"Incident: {digest_key(window.user)}",
    ]
    return Message(title=one_line(title), body="\n".join(one_line(line) for line in lines))


# --- routing ---------------------------------------------------------------------------


def is_admin_channel(channel: Mapping[str, Any]) -> bool:
    """A channel without groups, roles or users gets every incident."""
    return not (channel.get("groups") or channel.get("roles") or channel.get("users"))


def routes(channel: Mapping[str, Any], incident: Incident, groups: list[str],
           admin_only_rules: tuple[str, ...] | list[str] = ADMIN_ONLY_RULES) -> bool:
    """Whether this channel gets this incident; ``groups`` are the server's user's groups.

    A channel's optional ``rules`` list narrows it to those rules.
    """
    rules = channel.get("rules")
    if rules and incident.rule not in rules:
        return False
    if is_admin_channel(channel):
        return True
    server = incident.server
    if server is None or incident.rule in admin_only_rules:
        return False
    event = hub_event(incident)
    if incident.rule == ROLE_REQUEST:
        # a request goes to those who may decide it (the user's groups' channels, where
        # their instructors are); its decision or withdrawal to the user
        if isinstance(event, RoleRequestAsked):
            return bool(set(groups) & set(channel.get("groups") or ()))
        return server.user in (channel.get("users") or ())
    if incident.rule == HOME_DISK:
        # a home is its user's: told to them and the admins
        return server.user in (channel.get("users") or ())
    if incident.rule == BUDGET:
        # a budget is its user's, or its group's: not a concern of the user's other
        # groups, nor of the server's role
        budget_group = ({event.budget_name} if isinstance(event, BudgetEvent)
                        and event.budget_kind == "group" else set())
        return (server.user in (channel.get("users") or ())
                or bool(budget_group & set(channel.get("groups") or ())))
    return (server.user in (channel.get("users") or ())
            or server.role in (channel.get("roles") or ())
            or bool(set(groups) & set(channel.get("groups") or ())))


# --- sending ---------------------------------------------------------------------------


class SendError(Exception):
    """A channel's attempt failed; the text is safe to log (no URL, no secret)."""


_NATIVE = {
    "feishu": "https://open.feishu.cn",
    "lark": "https://open.larksuite.com",
    "dingtalk": "https://oapi.dingtalk.com",
}


def feishu_sign(timestamp: str, secret: str) -> str:
    """Feishu's and Lark's: base64(HMAC-SHA256(key="<timestamp>\\n<secret>", msg=b""))."""
    key = f"{timestamp}\n{secret}".encode()
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()


def dingtalk_sign(timestamp: str, secret: str) -> str:
    """DingTalk's, before URL-encoding: base64(HMAC-SHA256(key=secret, msg="<ts>\\n<secret>"))."""
    mac = hmac.new(secret.encode(), f"{timestamp}\n{secret}".encode(), hashlib.sha256)
    return base64.b64encode(mac.digest()).decode()


@dataclass(frozen=True)
class NativeChannel:
    """A Feishu, Lark or DingTalk bot, signed here."""

    scheme: str
    token: str
    secret: str
    base: str

    @classmethod
    def parse(cls, url: str) -> NativeChannel:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        query = parse_qs(parts.query)
        base = (query.get("base") or [_NATIVE[scheme]])[0].rstrip("/")
        if scheme == "dingtalk":  # apprise's form: dingtalk://[secret@]token[/...]
            token, secret = parts.hostname or "", parts.username or ""
            if not secret and query.get("secret"):
                secret = query["secret"][0]
            # urlsplit lower-cases the host; the token is case-sensitive.
            netloc = parts.netloc.rsplit("@", 1)[-1]
            token = netloc.split(":", 1)[0] or token
        else:
            path = [p for p in parts.path.split("/") if p]
            token, secret = parts.netloc, (path[0] if path else "")
        if not token:
            form = ("dingtalk://[SECRET@]ACCESS-TOKEN" if scheme == "dingtalk"
                    else f"{scheme}://HOOK-TOKEN[/SIGNING-SECRET]")
            raise ValueError(f"a {scheme}:// URL needs its bot's token, as in {form}")
        if not urlsplit(base).scheme.startswith("http"):
            raise ValueError("its base= must be an http(s) URL, such as "
                             "base=https://relay.example.org")
        return cls(scheme, token, secret, base)

    def secrets(self) -> list[str]:
        return [s for s in (self.token, self.secret) if s]

    def send(self, message: Message, timeout: float) -> None:
        """Post the message; raises SendError. Blocks (network)."""
        timestamp = str(int(time.time()))
        if self.scheme == "dingtalk":
            params = {"access_token": self.token}
            if self.secret:
                millis = str(int(time.time() * 1000))
                params.update(timestamp=millis, sign=dingtalk_sign(millis, self.secret))
            url = f"{self.base}/robot/send?{urlencode(params)}"
            payload: dict[str, Any] = {"msgtype": "text", "text": {"content": message.text}}
            code_key = "errcode"
        else:
            url = f"{self.base}/open-apis/bot/v2/hook/{quote(self.token, safe='')}"
            payload = {"msg_type": "text", "content": {"text": message.text}}
            if self.secret:
                payload = {"timestamp": timestamp, "sign": feishu_sign(timestamp, self.secret),
                           **payload}
            code_key = "code"
        try:
            reply = requests.post(url, data=json.dumps(payload, ensure_ascii=False).encode(),
                                  headers={"Content-Type": "application/json; charset=utf-8"},
                                  timeout=timeout)
        except requests.RequestException as error:
            raise SendError(f"cannot reach it ({type(error).__name__})") from None
        if reply.status_code != 200:
            raise SendError(f"it answered HTTP {reply.status_code}")
        try:
            answer = reply.json()
        except ValueError:
            raise SendError("it answered something other than JSON") from None
        # Feishu's older bots answer StatusCode; every refusal comes with HTTP 200.
        code = answer.get(code_key, answer.get("StatusCode", 0)) if isinstance(answer, dict) \
            else None
        if code not in (0, None):
            text = answer.get("msg") or answer.get("errmsg") or answer.get("StatusMessage") or ""
            raise SendError(f"it refused the message: {code_key} {code} {str(text)[:200]}")


class AppriseChannel:
    """Any apprise URL: mailto://, wecombot://, slack://, json://, jsons:// and the rest."""

    def __init__(self, url: str, timeout: float, quiet: bool = False):
        """``quiet``: a URL being checked (at start, or --test-channel), whose refusal
        the ValueError says, without apprise's own line."""
        import apprise

        self._apprise = apprise
        parts = urlsplit(url)
        query = parse_qs(parts.query)
        # apprise's own connect and read timeouts, unless the URL sets them
        extra = {k: f"{timeout:g}" for k in ("cto", "rto") if k not in query}
        if extra:
            url += ("&" if parts.query else ("" if url.endswith("?") else "?")) + urlencode(extra)
        self.url = url
        self.asset = apprise.AppriseAsset(app_id="quota-spawner watchdog",
                                          app_desc="GPU and memory watchdog")
        probe = apprise.Apprise(asset=self.asset)
        if quiet:  # its error would show parts of the URL; ours says why instead
            with _apprise_quiet():
                accepted = probe.add(url)
        else:
            accepted = probe.add(url)
        if not accepted:
            raise ValueError(_refused_url(parts.scheme))

    def secrets(self) -> list[str]:
        parts = urlsplit(self.url)
        return [s for s in (parts.password, parts.username, parts.hostname)
                if s and len(s) >= 8] + [p for p in parts.path.split("/") if len(p) >= 8]

    def send(self, message: Message, timeout: float, severity: str, kind: str) -> None:
        apprise = self._apprise
        notify_type = (apprise.NotifyType.SUCCESS if kind == "resolve"
                       else apprise.NotifyType.FAILURE if severity == "critical"
                       else apprise.NotifyType.INFO if severity == "info"
                       else apprise.NotifyType.WARNING)
        # a fresh object per attempt: apprise objects are not shared between threads
        sender = apprise.Apprise(asset=self.asset)
        sender.add(self.url)
        result = sender.notify(body=message.body, title=message.title, notify_type=notify_type,
                               body_format=apprise.NotifyFormat.TEXT)
        if not result:
            raise SendError("apprise could not deliver it (its log says why)")


@contextmanager
def _apprise_quiet() -> Any:
    """apprise's log off for a moment: its "Unparseable URL" line shows part of the URL
    (with its tokens); the ValueError that follows says what is wrong instead. Only
    while URLs are checked at start: a delivery's warnings are logged as ever."""
    log = logging.getLogger("apprise")
    was = log.disabled
    log.disabled = True
    try:
        yield
    finally:
        log.disabled = was


def _refused_url(scheme: str) -> str:
    """Why apprise refused a URL, without the URL: an unknown scheme, or a known one
    with a part missing or misspelt."""
    try:
        from apprise.plugins import N_MGR

        service = N_MGR[scheme.lower()].service_name if scheme.lower() in N_MGR else None
    except Exception:  # another apprise's layout: say less
        return f"apprise does not accept this {scheme}:// URL"
    if service is None:
        return (f"{scheme}:// is not a kind of channel apprise or the watchdog knows "
                "(a typo? mailtos://, json://, jsons://, slack://, wecombot://, "
                "feishu://, lark:// and dingtalk:// are some that are)")
    return (f"apprise does not accept this {service} URL ({scheme}://): a part of it is "
            "missing or misspelt (docs/watchdog.md#channels and apprise's wiki show its form)")


def _redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def _run_in_thread(fn: Callable[[], Any]) -> asyncio.Future[Any]:
    """fn in a new daemon thread: one stuck channel never holds a shared pool's workers."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if future.done():  # given up on after the timeout
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def target() -> None:
        try:
            value = fn()
        except BaseException as error:  # handed to the awaiting task
            loop.call_soon_threadsafe(settle, False, error)
        else:
            loop.call_soon_threadsafe(settle, True, value)

    threading.Thread(target=target, name="watchdog-notify", daemon=True).start()
    return future


class Notifier(LoggingConfigurable):
    """Sends the watchdog's events to its channels; configure with ``c.Notifier.<name>``."""

    channels = List(Dict(), config=True, help="""
        The channels, each {"url": ..., "name": ..., "groups": [...], "roles": [...],
        "users": [...], "rules": [...]}. url is an apprise URL (mailto://, dingtalk://,
        wecombot://, slack://, json://, jsons://) or feishu://TOKEN/SECRET or lark://TOKEN/SECRET.
        A channel without groups, roles and users is an admin channel and gets every
        incident; with them, the incidents of servers whose user is in one of the groups,
        has one of the roles or is one of the users. rules (optional) narrows a channel
        to those rules. docs/watchdog.md has an example of each.""")
    hub_url = Unicode(config=True, help="The hub's public URL, for the server links.")
    host = Unicode(config=True, help="This host's name in the messages.")
    timeout = Float(10.0, config=True, help="Seconds one try of one channel may take.")
    tries = Integer(3, config=True, help="Tries per channel and message.")
    retry_delay = Float(2.0, config=True,
                        help="Seconds before the second try; doubled before each next one.")
    admin_only_rules = List(Unicode(), list(ADMIN_ONLY_RULES), config=True,
                            help="Rules whose incidents only admin channels get.")
    user_message_limit = Integer(5, config=True, help="""
        At most this many messages about one user (their server's incidents, their role
        requests) go to one channel in user_message_period; the rest of that period's are
        held and told in one digest when it ends. A channel that names the user in its
        users gets every message about them. 0: no limit.""")
    user_message_period = Float(3600.0, config=True, help="""
        Seconds of user_message_limit's window, from the first message about the user to
        the channel; its digest goes out at the first cycle after it.""")

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        # the windows of a Notifier used alone; the watchdog passes its book's (kept)
        self.limits = MessageLimits()

    @validate("user_message_limit")
    def _check_limit(self, proposal: dict[str, Any]) -> int:
        if proposal["value"] < 0:
            raise TraitError(f"user_message_limit must be 0 (no limit) or more, not "
                             f"{proposal['value']}")
        return int(proposal["value"])

    @validate("user_message_period")
    def _check_period(self, proposal: dict[str, Any]) -> float:
        value = proposal["value"]
        if not (math.isfinite(value) and value > 0):
            raise TraitError(f"user_message_period must be seconds above 0, not {value}")
        return float(value)

    @default("hub_url")
    def _hub_url_default(self) -> str:
        parent_url = getattr(self.parent, "hub_url", "")
        return parent_url or os.environ.get("JUPYTERHUB_PUBLIC_URL", "http://127.0.0.1:8000")

    @default("host")
    def _host_default(self) -> str:
        return getattr(self.parent, "host_name", "") or socket.gethostname()

    @validate("channels")
    def _check_channels(self, proposal: dict[str, Any]) -> list[dict[str, Any]]:
        checked = []
        for number, channel in enumerate(proposal["value"], 1):
            channel = dict(channel)
            url = channel.get("url")
            if not isinstance(url, str) or "://" not in url:
                raise TraitError(f"channel {number} needs a url such as mailto://... "
                                 "or feishu://TOKEN/SECRET")
            scheme = url.split("://", 1)[0].lower()
            channel.setdefault("name", f"{scheme}-{number}")
            for key in ("groups", "roles", "users", "rules"):
                value = channel.get(key) or []
                if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                    raise TraitError(f"channel {channel['name']}: {key} must be a list of names")
                channel[key] = list(value)
            try:
                self._sender(url, quiet=True)
            except ValueError as error:
                raise TraitError(f"channel {channel['name']}: {error}") from None
            checked.append(channel)
        return checked

    def _sender(self, url: str, quiet: bool = False) -> NativeChannel | AppriseChannel:
        scheme = url.split("://", 1)[0].lower()
        if scheme in _NATIVE:
            return NativeChannel.parse(url)
        return AppriseChannel(url, self.timeout, quiet)

    def message(self, event: Event, now: float | None = None) -> Message:
        return format_message(event, self.hub_url, self.host, now)

    def channels_for(self, incident: Incident, groups: list[str]) -> list[dict[str, Any]]:
        return [c for c in self.channels
                if routes(c, incident, groups, tuple(self.admin_only_rules))]

    def _attempt(self, sender: NativeChannel | AppriseChannel, message: Message,
                 event: Event) -> None:
        """One try (blocking: network)."""
        if isinstance(sender, NativeChannel):
            sender.send(message, self.timeout)
        else:
            sender.send(message, self.timeout, event.incident.severity, event.kind)

    async def _deliver(self, channel: Mapping[str, Any], message: Message, event: Event) -> bool:
        """Tries one channel up to ``tries`` times; True when it took the message."""
        name = channel["name"]
        key = one_line(event.incident.key)  # it holds names users chose: one log line
        try:
            sender = self._sender(channel["url"])
        except ValueError as error:
            self.log.error("Channel %s: %s", name, error)
            return False
        secrets = sender.secrets()
        delay = self.retry_delay
        for attempt in range(1, self.tries + 1):
            try:
                await asyncio.wait_for(
                    _run_in_thread(lambda: self._attempt(sender, message, event)), self.timeout)
            except asyncio.TimeoutError:
                reason = f"no answer within {self.timeout:g}s"
            except SendError as error:
                reason = str(error)
            except Exception as error:  # a plugin's own bug: logged, never raised
                reason = f"{type(error).__name__}: {error}"
            else:
                self.log.info("Channel %s: sent %s of %s", name, event.kind, key)
                return True
            reason = _redact(reason, secrets)
            if attempt < self.tries:
                self.log.warning("Channel %s: try %d of %d failed (%s); again in %gs",
                                 name, attempt, self.tries, reason, delay)
                await asyncio.sleep(delay)
                delay *= 2
            else:
                self.log.error("Channel %s: gave up on %s of %s after %d tries (%s)",
                               name, event.kind, key, self.tries, reason)
        return False

    async def send(self, event: Event,
                   groups_of: GroupsOf | Callable[[str], Awaitable[list[str]]] | None = None,
                   now: float | None = None, message: Message | None = None,
                   limits: MessageLimits | None = None) -> dict[str, bool]:
        """Send one event to every channel that routes it, all at once.

        ``groups_of`` gives a user's groups (a dict, or a function answering from
        a cache: it is called on the event loop); ``message``, the event's message
        when the caller made it already; ``limits``, the counts of messages about each
        user (the Notifier's own by default). Returns {channel name: delivered} of the
        channels it went to (not those that hold it for a digest); never raises for a
        channel's failure.
        """
        if event.kind not in KINDS:
            raise ValueError(f"unknown event kind {event.kind!r}; expected one of {KINDS}")
        incident = event.incident
        groups: list[str] = []
        if incident.server is not None and groups_of is not None:
            try:
                if isinstance(groups_of, Mapping):
                    found: Any = groups_of.get(incident.server.user, [])
                else:
                    found = groups_of(incident.server.user)
                    if asyncio.iscoroutine(found) or isinstance(found, asyncio.Future):
                        found = await found
                groups = list(found or [])
            except Exception as error:  # admins still get it
                self.log.warning("Cannot read %s's groups (%s): only admin and role channels "
                                 "get %s", incident.server.user, error, incident.key)
        channels = self.held_back(event, self.channels_for(incident, groups),
                                  time.time() if now is None else now,
                                  self.limits if limits is None else limits)
        if not channels:
            return {}
        message = message or self.message(event, now)
        results = await asyncio.gather(*(self._deliver(c, message, event) for c in channels))
        return {c["name"]: ok for c, ok in zip(channels, results, strict=True)}

    def held_back(self, event: Event, channels: list[dict[str, Any]], now: float,
                  limits: MessageLimits) -> list[dict[str, Any]]:
        """The ``channels`` that get ``event`` now: each counts it against the user it is
        about (``limited``), and one past user_message_limit holds it for its digest."""
        user = about(event.incident)
        if not user:
            return channels
        kind = kind_of(event)
        going = []
        for channel in channels:
            if not limited(channel, user) or limits.admit(
                    channel["name"], user, kind, now, self.user_message_limit,
                    self.user_message_period):
                going.append(channel)
                continue
            # the first held one of a window is said; the rest are in the log anyway
            log = self.log.info if limits.held(channel["name"], user) == 1 else self.log.debug
            log("Channel %s: holding %s of %s for the digest: over %d messages about %s "
                "in %s", channel["name"], event.kind, one_line(event.incident.key),
                self.user_message_limit, name(user), duration(self.user_message_period))
        return going

    async def send_digests(self, limits: MessageLimits | None = None,
                           now: float | None = None) -> list[tuple[str, bool]]:
        """One digest to each channel whose window of messages about a user has ended
        holding some; (channel name, delivered) of each. A channel no longer configured
        gets none (logged)."""
        now = time.time() if now is None else now
        limits = self.limits if limits is None else limits
        by_name = {c["name"]: c for c in self.channels}
        going = []
        for window in limits.due(now, self.user_message_period):
            channel = by_name.get(window.channel)
            if channel is None:
                self.log.info("No channel %s any more: its digest of %d messages about %s "
                              "is not sent", window.channel, window.held_count,
                              name(window.user))
                continue
            message = digest_message(window, self.host, self.user_message_limit,
                                     self.user_message_period, now)
            incident = Incident(key=digest_key(window.user), rule=DIGEST, severity="info",
                                server=None, since=window.start, opened=now,
                                what=message.body)
            self.log.warning("%s | %s", message.title, message.body.replace("\n", " | "))
            going.append((channel, message, Event("open", incident)))
        # all at once, as an event's channels: a slow one holds up no other digest
        results = await asyncio.gather(*(self._deliver(*one) for one in going))
        return [(c["name"], ok) for (c, _, _), ok in zip(going, results, strict=True)]

    def test_channel(self, url: str, name: str = "test") -> bool:
        """Send a test message to one channel URL, with the usual tries; blocks.

        For ``quota-spawner watchdog --test-channel URL``: True when it was delivered;
        the log says why not. ValueError, with a sentence that does not show the URL,
        for a URL no sender takes.
        """
        channel = {"url": url, "name": name}
        if "://" not in url:
            raise ValueError("a channel URL has a scheme and ://, such as "
                             "mailtos://… or feishu://TOKEN/SECRET")
        self._sender(url, quiet=True)  # ValueError for a URL no sender takes
        now = time.time()
        event = Event("open", Incident(
            key="test", rule="test", severity="info", server=None, since=now, opened=now,
            what="A test message from the quota-spawner watchdog: this channel works."))
        return asyncio.run(self._deliver(channel, self.message(event, now), event))
