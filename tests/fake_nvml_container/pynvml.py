"""FAKE ``pynvml`` for processes the tests cannot hand a FakeNvml to directly.

Notebook containers and Jupyter server subprocesses import ``pynvml`` by
name. Put this folder first on PYTHONPATH, next to a copy of
tests/fake_pynvml.py, and the GPU monitor reads fake GPUs instead of the real
library. The GPUs come from the JSON file named by $FAKE_NVML_STATE, re-read
whenever it changes, so a test can make a GPU busy or idle from outside:

    {"gpus": [{"uuid": "GPU-a", "used": 1073741824, "utilization": 80}],
     "init_error": "NVMLError_DriverNotLoaded"}        # optional

Fields are those of fake_pynvml.FakeGpu. Never installed in an image.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_pynvml as _fake  # noqa: E402

STATE = os.environ.get("FAKE_NVML_STATE", "/opt/fake-nvml/state.json")
_nvml = _fake.FakeNvml()
_seen: int | None = None


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
    _nvml.gpus = [_fake.FakeGpu(**gpu) for gpu in state.get("gpus", [])]
    error = state.get("init_error")
    _nvml.init_error = getattr(_fake, error) if error else None


def __getattr__(name: str) -> Any:
    attr = getattr(_nvml, name)
    if not (callable(attr) and name.startswith("nvml")):
        return attr

    def call(*args: Any, **kwargs: Any) -> Any:
        _load()
        return attr(*args, **kwargs)

    return call
