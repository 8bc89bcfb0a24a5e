"""The report's ``preemption`` field, built in-process from a notice file in tmp_path.

The same on a real server: tests/service/test_monitor.py (test_api_preemption_notice);
the page's banner: tests/browser/test_browser_monitor.py.
"""

from __future__ import annotations

import json
import time

import jsonschema
import pytest
from metrics_schema import DOC_SCHEMA, validate

from fake_pynvml import FakeGpu, FakeNvml
from spawner.notebook import checkpoint
from spawner.notebook.monitor.collector import GpuMonitor
from spawner.notebook.monitor.report import metrics_report, preemption_report

NOTICE = {
    "version": 1, "by": "bob", "by_role": "urgent-debug", "role": "gpu-training",
    "gpus": ["GPU-a"],
    "reason": "bob needs 1 GPU for the role 'urgent-debug' (priority 1000000), which "
              "outranks this server's role 'gpu-training' (priority 300000).",
    "signalled_at": 1764500000.0, "deadline": 1764500120.0, "grace_period": 120.0,
}


@pytest.fixture
def notice_file(tmp_path, monkeypatch):
    path = tmp_path / "preemption.json"
    monkeypatch.setattr(checkpoint, "NOTICE", str(path))
    return path


def report(visible: str = "GPU-a") -> dict:
    mon = GpuMonitor(nvml=FakeNvml([FakeGpu("GPU-a")]), env={"NVIDIA_VISIBLE_DEVICES": visible})
    mon.record(mon.sample())
    body = metrics_report(mon)
    validate(body)
    return body


def test_no_notice_is_null(notice_file):
    assert report()["preemption"] is None
    assert preemption_report() is None


def test_notice_with_seconds_left(notice_file):
    notice_file.write_text(json.dumps(NOTICE))
    assert preemption_report(now=1764500008.0) == {**NOTICE, "seconds_left": 112.0}
    assert preemption_report(now=1764501000.0)["seconds_left"] == 0.0
    body = report()
    assert body["preemption"]["by"] == "bob" and body["preemption"]["seconds_left"] == 0.0
    # also without a GPU reading: the notice is the hub's, not NVML's
    assert report(visible="void")["preemption"]["reason"] == NOTICE["reason"]


def test_the_live_countdown(notice_file):
    notice_file.write_text(json.dumps({**NOTICE, "deadline": time.time() + 112}))
    assert 111 < report()["preemption"]["seconds_left"] <= 112


@pytest.mark.parametrize("text", [
    "", '{"version": 1, "by": "bo', "<html>", '{"version": 1, "by": "bob"}', "[]",
])
def test_a_broken_notice_is_null(notice_file, text):
    notice_file.write_text(text)
    assert report()["preemption"] is None


def test_a_notice_directory_is_null(notice_file):
    notice_file.mkdir()
    assert report()["preemption"] is None


def test_fields_of_the_wrong_type_still_match_the_schema(notice_file):
    notice_file.write_text(json.dumps({**NOTICE, "by": None, "reason": 5, "gpus": "GPU-a",
                                       "grace_period": "2 min", "extra": "<b>x</b>"}))
    preemption = report()["preemption"]
    assert (preemption["by"], preemption["reason"], preemption["gpus"]) == (None, None, [])
    assert "extra" not in preemption


def test_the_doc_schema_has_the_field():
    schema = json.loads(DOC_SCHEMA.read_text())
    assert "preemption" in schema["required"]
    with pytest.raises(jsonschema.ValidationError):  # seconds_left is required
        jsonschema.validate({"preemption": NOTICE}, {
            "$defs": schema["$defs"], "properties": {"preemption": schema["properties"]
                                                     ["preemption"]}})
