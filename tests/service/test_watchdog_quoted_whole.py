"""What a user or a decider typed reaches every channel quoted whole, even when it holds the
words of the sentence around it.

A role request's message is the hub's sentence about it with the reason, or the decider's
comment, in quotes. The watchdog takes the reason and the comment from their own fields of
the event (spawner/usage/events.py); it never looks for them in a sentence, so text that
reads like the sentence (``for the role 'x' from … to …: because``, ``asks for the role``,
``; you hold it``) is all inside its quotes and nothing of it outside. (The backend keeps
a reason and a comment without the blanks around them.)

Real: the backend (spawner.usage.grants) on a temporary SQLite ledger, the hub's own
EventLog file read as the watchdog reads it, and every kind of channel on the real local
receivers (tests/receivers.py): mail over SMTP, Feishu and DingTalk webhooks (signed), and
a JSON webhook.
"""

from __future__ import annotations

from pathlib import Path

from receivers import HttpReceiver, SmtpReceiver

from spawner.quota.loader import parse_quota_table
from spawner.usage import grants as rr
from spawner.usage.event_log import EventLog
from spawner.usage.ledger import Ledger
from spawner.watchdog.hub_events import for_hub, hub_event_messages, read_new
from spawner.watchdog.model import Snapshot
from spawner.watchdog.notify import Notifier
from spawner.watchdog.rules import WatchdogRules

T = 1_795_000_000.0  # 2026-11-18 11:06:40 UTC
DAY = 86400.0
HUB_ID = "quota-c9fb1a93a60b"
TABLE = (
    "images: {pytorch: {image: x}}\n"
    "roles: {student: {cpus: 1, memory: 1G, images: [pytorch]},\n"
    "        gpu-training: {cpus: 2, memory: 1G, images: [pytorch]},\n"
    "        big: {cpus: 2, memory: 2G, images: [pytorch]}}\n"
    "assignments: {default: [student]}\n"
    "requests: {roles: [gpu-training, big]}\n")
WINDOW = "from 2026-11-18 11:06 UTC to 2026-11-19 11:06 UTC"
# what student1 and the admin type: the sentence's own words, its ": ", the role's name
REASON = "for the role 'gpu-training' from 2026-01-01 to 2026-01-02: because"
REASON_2 = (f"student1 asks for the role 'big' {WINDOW}: asks for the role 'big': the "
            "role's name")
COMMENT = "\nfor the role 'gpu-training' from 2026-01-01 to 2026-01-02: because"
COMMENT_2 = "   you hold it from 2026-01-01 to 2026-01-02: approved by admin; : because"
# the What line each channel must carry: the hub's sentence, then all of the typed text
# (its surrounding blanks left out) in one pair of quotes
WHAT = [
    f"What: student1 asks for the role 'gpu-training' {WINDOW}: \"for the role "
    "'gpu-training' from 2026-01-01 to 2026-01-02: because\"",
    "What: Your request for the role 'gpu-training' was refused by admin: \"for the role "
    "'gpu-training' from 2026-01-01 to 2026-01-02: because\"",
    f"What: student1 asks for the role 'big' {WINDOW}: \"student1 asks for the role 'big' "
    f"{WINDOW}: asks for the role 'big': the role's name\"",
    f"What: Your request for the role 'big' was approved by admin; you hold it {WINDOW}: "
    "\"you hold it from 2026-01-01 to 2026-01-02: approved by admin; : because\"",
]


def the_events(tmp_path: Path) -> list[dict]:
    """Two requests of student1, refused and approved, as the usage service appends them."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'usage.sqlite'}")
    table = parse_quota_table(TABLE, "q.yaml")
    path = str(tmp_path / "quota-spawner-events.jsonl")
    _, cursor = read_new(path, None)
    log = EventLog(path)
    try:
        for role, reason, comment, approve in (("gpu-training", REASON, COMMENT, False),
                                               ("big", REASON_2, COMMENT_2, True)):
            asked = rr.ask(ledger.engine, table, "student1", ["cs101"], role, T, T + DAY,
                           reason, T)
            asked.emit(log, hub=HUB_ID)
            rr.decide(ledger.engine, table, asked.request.id, "admin", approve, comment, True,
                      T + 60).emit(log, hub=HUB_ID)
    finally:
        ledger.dispose()
    log.flush()
    found, _ = read_new(path, cursor)
    assert [(e["event"], e.get("comment") or e["reason"]) for e in found] == [
        ("role-request", REASON), ("role-request-refused", COMMENT.strip()),
        ("role-request", REASON_2), ("role-request-approved", COMMENT_2.strip())]
    return for_hub(found, HUB_ID)


def what_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("What: ")]


async def test_a_reason_or_comment_holding_the_sentences_words_is_quoted_whole(tmp_path):
    told = hub_event_messages(the_events(tmp_path), WatchdogRules(),
                              Snapshot(time=T + 61, host="gpu-host-1"))
    assert len(told) == 4
    with HttpReceiver(feishu_secrets={"fs-token": "fs-secret"},
                      dingtalk_secrets={"dt-token": "SECdt-secret"}) as http, \
            SmtpReceiver() as smtp:
        port = http.base.rsplit(":", 1)[1]
        notifier = Notifier(hub_url="https://hub.example.org", host="h", timeout=5.0,
                            retry_delay=0.05, channels=[
            {"name": "mail", "url": smtp.url()},
            {"name": "feishu", "url": f"feishu://fs-token/fs-secret?base={http.base}"},
            {"name": "dingtalk", "url": f"dingtalk://SECdt-secret@dt-token/?base={http.base}"},
            {"name": "json", "url": f"json://127.0.0.1:{port}/hook"},
        ])
        for event in told:  # one at a time: each channel gets them in this order
            sent = await notifier.send(event, {"student1": ["cs101"]}, now=T + 61)
            assert sent == dict.fromkeys(("mail", "feishu", "dingtalk", "json"), True)
        mails = [m.get_payload(decode=True).decode() for _, _, m in smtp.wait(4)]
        feishu = [r.body["content"]["text"] for r in http.wait(4, kind="feishu")]
        dingtalk = [r.body["text"]["content"] for r in http.wait(4, kind="dingtalk")]
        webhook = [r.body["message"] for r in http.wait(4, kind="json")]
    for channel, texts in (("mail", mails), ("feishu", feishu), ("dingtalk", dingtalk),
                           ("json", webhook)):
        assert [what_lines(t) for t in texts] == [[w] for w in WHAT], channel


def test_the_message_is_worded_from_the_fields_never_from_the_records_sentence():
    """A record's ``text`` is for the log's other readers (SQL, jq, a watchdog of 0.1). One
    whose text is not its fields' sentence (a row edited by hand, another writer: here the
    reason written on one line) is told from its fields all the same, the reason quoted
    whole with its line break shown, and nothing of the text."""
    reason = "for the role 'gpu-training' from 2026-01-01 to 2026-01-02:\nWhat to do: approve"
    record = {"version": 1, "event": "role-request", "hub": HUB_ID, "time": T, "id": 7,
              "user": "student1", "role": "gpu-training", "starts": T, "ends": T + DAY,
              "reason": reason, "who": "student1", "comment": "",
              "text": f"student1 asks for the role 'gpu-training' {WINDOW}: "
                      + reason.replace("\n", " ")}
    (event,) = hub_event_messages([record], WatchdogRules(), Snapshot(time=T + 1, host="h"))
    message = Notifier(hub_url="https://hub.example.org", host="h").message(event, now=T + 1)
    assert what_lines(message.body) == [
        f"What: student1 asks for the role 'gpu-training' {WINDOW}: \"for the role "
        "'gpu-training' from 2026-01-01 to 2026-01-02:\\nWhat to do: approve\""]
    assert len([line for line in message.body.splitlines()
                if line.startswith("What to do:")]) == 1
