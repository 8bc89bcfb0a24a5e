"""The web app's input checks (spawner/webapp/inputs.py) on text that is not text: a lone
UTF-16 surrogate, which JSON allows ("\\ud800") and UTF-8 cannot encode, and NUL, which
PostgreSQL's text refuses; each parser every endpoint uses refuses them with a sentence
naming the field, and keeps every other code point, bidi controls included."""

from __future__ import annotations

import json

import pytest

from spawner.webapp import inputs
from spawner.webapp.inputs import BadInput

SURROGATE = ("holds an unpaired UTF-16 surrogate (U+{:04X}) at character {}, which is not "
             "text that can be stored; please remove it and send it again.")


def refused(fn, *args) -> str:
    with pytest.raises(BadInput) as caught:
        fn(*args)
    assert caught.value.status_code == 400
    return caught.value.sentence


@pytest.mark.parametrize("body, field, point, at", [
    ({"reason": "a\ud800b"}, "reason", 0xD800, 2),
    ({"comment": "\udfff"}, "comment", 0xDFFF, 1),
    ({"text": "roles:\n  \udc80x: {}"}, "table's text", 0xDC80, 10),
    ({"users": ["ann", "b\ud83d"]}, "users", 0xD83D, 2),  # high half of a pair, alone
    ({"deep": {"er": [{"x": "\ud800"}]}}, "deep", 0xD800, 1),
    ({"\ud800": 1}, "name of a field", 0xD800, 1),
    ({"deep": {"\udbff": 1}}, "name of a field in deep", 0xDBFF, 1),
])
def test_parse_json_refuses_a_lone_surrogate_anywhere(body, field, point, at):
    raw = json.dumps(body).encode()  # ASCII: "\ud800" as JSON writes it
    assert refused(inputs.parse_json, raw) == f"The {field} " + SURROGATE.format(point, at)


def test_parse_json_keeps_every_character_that_is_text():
    # a pair of surrogates is one character; bidi controls and any script are kept (the
    # pages isolate them)
    text = "eve\u202egnp.exe \u05e9\u05dc\u05d5\u05dd \U0001F600 \u2066x\u2069"
    body = json.dumps({"reason": text, text: [text]}).encode()
    assert inputs.parse_json(body) == {"reason": text, text: [text]}
    assert inputs.parse_json(b'{"x": "\\ud83d\\ude00"}') == {"x": "\U0001F600"}


def test_parse_json_refuses_nul():
    assert refused(inputs.parse_json, b'{"reason": "ok\\u0000"}') == (
        "The reason holds a NUL character (U+0000) at character 3, which is not text that "
        "can be stored; please remove it and send it again.")


def test_text_refuses_what_is_not_text_after_its_length():
    assert refused(inputs.text, "x\ud800", "comment", 10) == "The comment " + \
        SURROGATE.format(0xD800, 2)
    assert refused(inputs.text, "\ud800" * 11, "comment", 10) == (
        "Please keep the comment under 10 characters.")
    assert inputs.text("r\u202el", "reason", 10) == "r\u202el"


@pytest.mark.parametrize("raw, name, sentence", [
    (b"\xed\xa0\x80", "name", "The 'name' in the address is not UTF-8 text; please check "
                              "the link."),
    (b"\xff", None, "The address is not UTF-8 text; please check the link."),
    (b"a\x00", "group", "The 'group' in the address holds a NUL character (U+0000) at "
                        "character 2, which is not text that can be stored; please remove "
                        "it and send it again."),
])
def test_an_address_argument_must_be_text(raw, name, sentence):
    assert refused(inputs.argument, raw, name) == sentence


def test_an_address_argument_keeps_any_script():
    assert inputs.argument("eve\u202egnp.exe".encode(), "name") == "eve\u202egnp.exe"
