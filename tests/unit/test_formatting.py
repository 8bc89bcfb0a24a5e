"""One set of formatters for the web app: the service draws the pages with formatting.py,
and a page's script writes the little it still writes itself (a time in the browser's
zone, an isolated name) with static/format.js. Both must write those alike, so the same
table of values goes through both (the script in node) and the texts are compared."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from datetime import timezone
from pathlib import Path

import pytest

from spawner.quota.units import format_human
from spawner.webapp import formatting

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "spawner" / "webapp" / "static" / "format.js"
G = 2**30
NAN = math.nan

SIZES = [None, NAN, 0, 1, 512, 999.5, 1000, 1023, 1024, 1536, 10**6, 1000 * 2**20, 3 << 29,
         512 << 20, 8 * G, int(9.96 * G), 9.999 * G, 10**10, 1.125 * G, 14.94 * G, 99.96 * G,
         123.456789 * 2**20, 2**50, 2**60, -1536]
MOMENTS = [None, 0, 1_799_139_600, 1_799_139_659.9, -86400, 253_402_300_799, 1e12, 1e13,
           1e18, 1.5e300, NAN]
NAMES = ["alice", "eve\u202egnp.exe", "\u05e9\u05dc\u05d5\u05dd", ""]


def js_literal(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return json.dumps(value)


def run_script(calls: dict[str, str]) -> dict[str, list[str]]:
    """Each of ``calls`` (name: a JS expression over QuotaFormat, as F) in node."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    body = ", ".join(f"{json.dumps(name)}: {expression}" for name, expression in calls.items())
    code = (f"require({json.dumps(str(SCRIPT))}); const F = globalThis.QuotaFormat;\n"
            f"process.stdout.write(JSON.stringify({{{body}}}));")
    # the hub's times carry their zone; a time without one is UTC, in the browser too
    found = subprocess.run([node, "-e", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "TZ": "UTC"})
    return json.loads(found.stdout)


def each(values: list[object], call: str) -> str:
    return "[" + ", ".join(call.format(js_literal(v)) for v in values) + "]"


def test_the_pages_and_their_scripts_write_alike():
    script = run_script({
        "moment": each(MOMENTS, 'F.moment({}, "UTC")'),
        "isolate": each(NAMES, "F.isolate({})"),
    })
    service = {
        "moment": [formatting.moment(v, timezone.utc) for v in MOMENTS],
        "isolate": [formatting.isolate(v) for v in NAMES],
    }
    for kind, texts in service.items():
        assert script[kind] == texts, kind


def test_the_scripts_keep_only_the_formatters_they_use():
    """The pages are drawn by the service: format.js holds what a page's script still
    writes itself, and each page's script uses what it holds."""
    assert sorted(run_script({"names": "Object.keys(F)"})["names"]) == ["isolate", "moment"]
    used = (SCRIPT.parent / "classes.js").read_text(encoding="utf-8")
    assert "const { moment, isolate } = QuotaFormat;" in used


def test_sizes_keep_three_digits_and_never_an_exponent():
    assert [formatting.size(v) for v in SIZES[:13]] == [
        "–", "–", "0 B", "1 B", "512 B", "1000 B", "1000 B", "1023 B", "1 KiB", "1.5 KiB",
        "977 KiB", "1000 MiB", "1.5 GiB"]
    assert [format_human(v) for v in (8 * G, int(9.96 * G), 9.999 * G, 10**10, 1.125 * G,
                                      14.94 * G, 99.96 * G, 2**50, 2**60, -1536)] == [
        "8 GiB", "9.96 GiB", "10 GiB", "9.31 GiB", "1.13 GiB", "14.9 GiB", "100 GiB",
        "1024 TiB", "1048576 TiB", "-1.5 KiB"]


def test_a_size_against_its_limit():
    assert [formatting.size_of(used, limit) for used, limit in (
        (3 * G, 20 * G), (None, 20 * G), (3 * G, None), (None, None), (0, NAN))] == [
        "3 GiB of 20 GiB", "– of 20 GiB", "3 GiB", "–", "0 B"]


def test_unknown_values_are_a_dash_and_odd_times_say_so():
    assert formatting.duration(None) == formatting.percent(NAN) == formatting.size(None) == "–"
    assert formatting.moment(None) == "–"
    assert formatting.moment(1e18) == "an invalid time (1e+18)"
    assert formatting.iso(1e18) == ""
    assert formatting.moment(0, timezone.utc, zone=False) == "1970-01-01 00:00"
    assert formatting.percent(0.755) == "76%"  # half up, as the scripts round


def test_a_chosen_name_is_isolated_and_escaped():
    """TR9's isolation for a name someone chose: FSI … PDI in plain text, <bdi> in HTML,
    escaped; in a sentence written elsewhere (advice), each name where it stands as a word."""
    assert formatting.isolate("eve\u202egnp.exe") == "\u2068eve\u202egnp.exe\u2069"
    assert formatting.bdi("<b>&") == "<bdi>&lt;b&gt;&amp;</bdi>"
    text = "al used at most 1 GiB as gpu-lab; al holds no smaller role than gpu-lab-2 <x>."
    assert formatting.bdi_names(text, "al", "gpu-lab", None) == (
        "<bdi>al</bdi> used at most 1 GiB as <bdi>gpu-lab</bdi>; <bdi>al</bdi> holds no "
        "smaller role than gpu-lab-2 &lt;x&gt;.")
    assert formatting.bdi_names("<i> used", "<i>") == "<bdi>&lt;i&gt;</bdi> used"
