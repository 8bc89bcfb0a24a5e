"""FAKE ``pynvml`` for processes the tests cannot hand a FakeNvml to directly.

Notebook containers, Jupyter server subprocesses and the watchdog import
``pynvml`` by name. Put this folder first on PYTHONPATH, next to a copy of
tests/fake_pynvml.py, and they read fake GPUs instead of the real library.
The GPUs come from the JSON file named by $FAKE_NVML_STATE, re-read whenever
it changes, so a test can make a GPU busy, idle or lost from outside:

    {"gpus": [{"uuid": "GPU-a", "used": 1073741824, "utilization": 80,
               "processes": [[4242, 1073741824]]},           # (host PID, bytes)
              {"uuid": "GPU-b", "lost": true},                # fell off the bus
              {"uuid": "GPU-c", "mig_mode": 1, "mig": [{"uuid": "MIG-c0"}, null]},
              {"uuid": "GPU-d", "events": false,              # gives no XID events
               "fail": {"nvmlDeviceGetPowerUsage": "NVMLError_NotSupported"}}],
     "fail": {"nvmlDeviceGetTemperature": "NVMLError_NotSupported"},   # every GPU
     "xids": [{"uuid": "GPU-a", "xid": 79, "id": "first"}],
     "init_error": "NVMLError_DriverNotLoaded"}

Every key but "gpus" is optional. A GPU's fields are those of
fake_pynvml.FakeGpu; "mig" entries are GPUs too (null: an empty slot), and
errors are named by their fake_pynvml class.

"xids" are XID errors, each delivered once: to the first event set that
registers for its GPU (see fake_pynvml), and once read through
nvmlEventSetWait its "id" (default: its position in the list) is recorded in
$FAKE_NVML_XIDS_DELIVERED (default: the state file's path + ".xids-delivered"),
so neither a re-read of the file nor a restarted process delivers it again.
Append to the list to raise more. Where that file cannot be written, the
record is this process's only.

Never installed in an image.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_pynvml as _fake  # noqa: E402

STATE = os.environ.get("FAKE_NVML_STATE", "/opt/fake-nvml/state.json")
DELIVERED = os.environ.get("FAKE_NVML_XIDS_DELIVERED", STATE + ".xids-delivered")
_nvml = _fake.FakeNvml()
_seen: int | None = None
_queued: set[str] = set()  # XID ids handed to the fake by this process
_delivered: set[str] = set()  # XID ids read by this process


def _errors(names: dict[str, str]) -> dict[str, type[_fake.NVMLError]]:
    return {function: getattr(_fake, error) for function, error in names.items()}


def _gpu(fields: dict[str, Any]) -> _fake.FakeGpu:
    fields = dict(fields)
    fields["mig"] = [_gpu(m) if m is not None else None for m in fields.get("mig", [])]
    fields["fail"] = _errors(fields.get("fail", {}))
    return _fake.FakeGpu(**fields)


def _recorded() -> set[str]:
    try:
        with open(DELIVERED, encoding="utf-8") as f:
            return {line.strip() for line in f if line.strip()}
    except OSError:
        return set()


def _record(event: Any) -> None:
    ident = getattr(event, "fake_id", None)
    if ident is None:
        return
    _delivered.add(ident)
    try:
        with open(DELIVERED, "a", encoding="utf-8") as f:
            f.write(ident + "\n")
    except OSError:
        pass  # a read-only folder: this process's record only


def _load() -> None:
    global _seen
    if len(_nvml.calls) > 1000:
        _nvml.calls.clear()  # a long-running server must not grow this forever
    try:
        stamp = os.stat(STATE).st_mtime_ns
    except OSError:
        return
    if stamp == _seen:
        return
    with open(STATE, encoding="utf-8") as f:
        state = json.load(f)
    _seen = stamp
    _nvml.gpus = [_gpu(gpu) for gpu in state.get("gpus", [])]
    _nvml.fail = _errors(state.get("fail", {}))
    error = state.get("init_error")
    _nvml.init_error = getattr(_fake, error) if error else None
    xids = state.get("xids", [])
    done = _queued | _delivered | (_recorded() if xids else set())
    for n, xid in enumerate(xids):
        ident = str(xid.get("id", n))
        if ident in done:
            continue
        try:
            _nvml.xid(xid["uuid"], int(xid["xid"]), ident=ident)
        except ValueError:
            continue  # no such GPU (yet): tried again at the next change of the file
        _queued.add(ident)


def __getattr__(name: str) -> Any:
    attr = getattr(_nvml, name)
    if not (callable(attr) and name.startswith("nvml")):
        return attr

    def call(*args: Any, **kwargs: Any) -> Any:
        _load()
        result = attr(*args, **kwargs)
        if name == "nvmlEventSetWait":
            _record(result)
        return result

    return call
