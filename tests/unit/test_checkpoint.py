"""spawner.notebook.checkpoint: reading the preemption notice, and on_preempt in real processes.

Each on_preempt test runs a child Python that installs the handler with the
notice and PID paths pointed into tmp_path, then sends it SIGTERM as the hub
does. No Docker.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from spawner.contract import PREEMPT_NOTICE, PREEMPT_PIDS_DIR
from spawner.notebook import checkpoint
from spawner.notebook.checkpoint import parse_notice, read_notice, seconds_left

ROOT = Path(__file__).resolve().parents[2]

NOTICE = {
    "version": 1, "by": "bob", "by_role": "urgent-debug", "role": "gpu-training",
    "gpus": ["GPU-5f2c1e7a", "GPU-0d3b4c55"],
    "reason": "bob needs 1 GPU for the role 'urgent-debug' (priority 1000000), which "
              "outranks this server's role 'gpu-training' (priority 300000).",
    "signalled_at": 1764500000.0, "deadline": 1764500120.0, "grace_period": 120.0,
}


def write_notice(path: Path, notice: dict | str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(notice if isinstance(notice, str) else json.dumps(notice))
    tmp.replace(path)


# --- the notice -------------------------------------------------------------------


def test_paths_default_to_the_contract():
    assert (checkpoint.NOTICE, checkpoint.PIDS_DIR) == (PREEMPT_NOTICE, PREEMPT_PIDS_DIR)


def test_read_notice(tmp_path, monkeypatch):
    path = tmp_path / "preemption.json"
    monkeypatch.setattr(checkpoint, "NOTICE", str(path))
    assert checkpoint.notice() is None and seconds_left() is None  # no file
    write_notice(path, NOTICE)
    assert checkpoint.notice() == NOTICE
    assert read_notice(str(path)) == NOTICE
    assert seconds_left(now=1764500008.0) == 112.0
    assert seconds_left(now=1764500500.0) == 0.0  # past the deadline: the stop is under way
    assert seconds_left(NOTICE, now=1764500100.5) == 19.5
    path.unlink()  # withdrawn
    assert checkpoint.notice() is None


@pytest.mark.parametrize("text", [
    "",
    '{"version": 1, "by": "bob", "deadl',  # written in part
    "not json",
    "[1, 2]",
    "null",
    '{"version": 2, "deadline": 1764500120.0}',
    '{"deadline": 1764500120.0}',
    '{"version": 1}',
    '{"version": 1, "deadline": "soon"}',
    '{"version": 1, "deadline": true}',
    '{"version": 1, "deadline": NaN}',
    b'{"version": 1, "deadline": 1, "by": "\xff"}',
])
def test_a_broken_notice_is_none(text):
    assert parse_notice(text) is None


def test_notice_fields_of_the_wrong_type_become_null():
    parsed = parse_notice(json.dumps({
        "version": 1, "deadline": 1764500120, "by": 7, "by_role": None, "role": ["x"],
        "gpus": ["GPU-a", 3, None], "reason": {"html": "<b>"}, "signalled_at": "now",
        "grace_period": 120, "extra": "dropped",
    }))
    assert parsed == {"version": 1, "by": None, "by_role": None, "role": None,
                      "gpus": ["GPU-a"], "reason": None, "signalled_at": None,
                      "deadline": 1764500120.0, "grace_period": 120.0}
    assert parse_notice('{"version": 1, "deadline": 5, "gpus": "GPU-a"}')["gpus"] == []


def test_read_notice_tolerates_odd_files(tmp_path):
    assert read_notice(str(tmp_path)) is None  # a directory
    assert read_notice(str(tmp_path / "missing")) is None
    big = tmp_path / "big.json"
    big.write_text(json.dumps({**NOTICE, "reason": "x" * checkpoint.MAX_NOTICE_BYTES}))
    assert read_notice(str(big)) is None
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    assert read_notice(str(fifo)) is None  # no writer: must not block
    assert time.monotonic() - started < 1
    unreadable = tmp_path / "unreadable.json"
    write_notice(unreadable, NOTICE)
    unreadable.chmod(0)
    if os.geteuid() != 0:  # root reads it anyway
        assert read_notice(str(unreadable)) is None


# --- on_preempt in a child process -------------------------------------------------

CHILD = r"""
import json, os, signal, sys, time
from spawner.notebook import checkpoint

cfg = json.loads(sys.argv[1])
checkpoint.NOTICE, checkpoint.PIDS_DIR = cfg["notice"], cfg["pids"]
out = cfg["out"]

def record(line):
    with open(out, "a") as f:
        f.write(line + "\n")

if cfg.get("previous"):
    signal.signal(signal.SIGTERM, lambda signum, frame: record("previous"))

def callback(notice):
    record(json.dumps(notice))
    if cfg.get("slow"):
        time.sleep(cfg["slow"])  # a second SIGTERM comes meanwhile
        record("slept")
    if cfg.get("fail"):
        raise RuntimeError("disk full")

checkpoint.on_preempt(callback, exit=cfg.get("exit", False))
if cfg.get("again"):
    checkpoint.on_preempt(callback, exit=cfg.get("exit", False))  # a cell run twice
if cfg.get("fork"):
    child = os.fork()
    if child == 0:
        # said from the child itself: a SIGTERM in the instant after fork, before Python
        # set up its signal state again, would be lost
        record("forked %d" % os.getpid())
        time.sleep(60)
        os._exit(3)
    record("child %d" % child)
record("ready")
sys.stdin.readline()  # until the test closes stdin
record("done")
"""


class Child:
    """A Python process that called on_preempt, with its paths in tmp_path."""

    def __init__(self, tmp_path: Path, **cfg):
        tmp_path.mkdir()
        self.notice = tmp_path / "preemption.json"
        self.pids = tmp_path / "quota-spawner" / "pids"
        self.out = tmp_path / "out.txt"
        cfg = {"notice": str(self.notice), "pids": str(self.pids), "out": str(self.out), **cfg}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps(cfg)], cwd=ROOT,
            stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.wait_for(lambda lines: "ready" in lines, "ready")
        self.pid_file = self.pids / str(self.proc.pid)

    def lines(self) -> list[str]:
        return self.out.read_text().splitlines() if self.out.exists() else []

    def calls(self) -> list[dict | None]:
        """The notices the callback was called with."""
        return [json.loads(line) for line in self.lines()
                if line.startswith("{") or line == "null"]

    def wait_for(self, check, what: str, timeout: float = 10) -> list[str]:
        deadline = time.monotonic() + timeout
        while not check(self.lines()):
            if self.proc.poll() is not None and not check(self.lines()):
                raise AssertionError(f"child exited ({self.proc.returncode}) before {what}: "
                                     f"{self.lines()}\n{self.proc.stderr.read()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {self.lines()}")
            time.sleep(0.02)
        return self.lines()

    def sigterm(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def finish(self) -> tuple[int, str]:
        """Close stdin (a normal exit where it still runs); the exit status and stderr."""
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        self.proc.wait(10)
        return self.proc.returncode, self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def child(tmp_path):
    children = []

    def make(**cfg) -> Child:
        c = Child(tmp_path / f"child{len(children)}", **cfg)
        children.append(c)
        return c

    yield make
    for c in children:
        c.kill()


def test_callback_gets_the_notice_and_the_kernel_goes_on(child):
    c = child()
    assert c.pid_file.is_file()  # registered for the hub's SIGTERM
    assert oct(c.pids.stat().st_mode & 0o777) == oct(0o700)
    write_notice(c.notice, NOTICE)
    c.sigterm()
    c.wait_for(lambda lines: len(lines) == 2, "the callback")
    assert c.calls() == [NOTICE]
    # the same notice again (the hub signals a kernel that registered twice): ignored
    c.sigterm()
    time.sleep(0.3)
    assert c.proc.poll() is None, "exit=False: the process goes on"
    assert c.calls() == [NOTICE]
    # a new preemption after the first was withdrawn: a new checkpoint
    later = {**NOTICE, "signalled_at": NOTICE["signalled_at"] + 600,
             "deadline": NOTICE["deadline"] + 600}
    write_notice(c.notice, later)
    c.sigterm()
    c.wait_for(lambda lines: len(lines) == 3, "the second callback")
    assert c.calls() == [NOTICE, later]
    status, stderr = c.finish()
    assert (status, stderr) == (0, "")
    assert c.lines()[-1] == "done"
    assert not c.pid_file.exists()  # removed at exit


def test_exit_true_ends_the_process_with_status_0(child):
    c = child(exit=True)
    write_notice(c.notice, NOTICE)
    c.sigterm()
    assert c.proc.wait(10) == 0
    assert c.calls() == [NOTICE]
    assert "done" not in c.lines()
    assert not c.pid_file.exists()


def test_without_a_notice_the_callback_gets_none(child):
    c = child()
    c.sigterm()
    c.wait_for(lambda lines: len(lines) == 2, "the callback")
    assert c.calls() == [None]
    assert c.proc.poll() is None
    assert c.finish()[0] == 0


def test_a_second_sigterm_while_the_callback_runs_is_ignored(child):
    c = child(slow=1.0, exit=True)
    write_notice(c.notice, NOTICE)
    c.sigterm()
    c.wait_for(lambda lines: len(lines) == 2, "the callback to start")
    c.sigterm()  # during the sleep
    time.sleep(0.1)
    c.sigterm()
    assert c.proc.wait(10) == 0
    assert c.lines() == ["ready", json.dumps(NOTICE), "slept"]


def test_chains_to_the_previous_handler(child):
    c = child(previous=True)
    write_notice(c.notice, NOTICE)
    c.sigterm()
    c.wait_for(lambda lines: "previous" in lines, "the previous handler")
    assert c.lines() == ["ready", json.dumps(NOTICE), "previous"]  # the callback first
    assert c.proc.poll() is None


def test_calling_it_again_replaces_the_callback(child):
    c = child(previous=True, again=True)
    write_notice(c.notice, NOTICE)
    c.sigterm()
    c.wait_for(lambda lines: "previous" in lines, "the previous handler")
    time.sleep(0.2)
    # once, and the previous handler is the user's, not the first on_preempt
    assert c.lines() == ["ready", json.dumps(NOTICE), "previous"]


def test_a_failing_callback_is_printed_not_raised(child):
    c = child(fail=True)
    c.sigterm()
    c.wait_for(lambda lines: len(lines) == 2, "the callback")
    time.sleep(0.2)
    assert c.proc.poll() is None
    status, stderr = c.finish()
    assert status == 0 and "done" in c.lines()
    assert "on_preempt: the callback failed" in stderr and "RuntimeError: disk full" in stderr

    c = child(fail=True, exit=True)
    c.sigterm()
    assert c.proc.wait(10) == 1


def ended(pid: int) -> bool:
    """Gone, or a zombie: its parent (blocked on stdin) has not reaped it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_forked_child_keeps_the_default(child):
    c = child(fork=True)
    [line] = [x for x in c.lines() if x.startswith("child ")]
    pid = int(line.split()[1])
    c.wait_for(lambda lines: f"forked {pid}" in lines, "the forked child to run")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while not ended(pid):  # the forked child dies of the signal, without the callback
        if time.monotonic() > deadline:
            pytest.fail("the forked child did not end at SIGTERM")
        time.sleep(0.02)
    assert c.calls() == []
    assert c.pid_file.is_file()  # the child's exit left the parent's file alone
    assert c.finish()[0] == 0


def test_an_unwritable_pid_dir_does_not_stop_it(tmp_path, child):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the folder should be")
    c = child(pids=str(blocker / "pids"))
    c.sigterm()
    c.wait_for(lambda lines: len(lines) == 2, "the callback")
    assert c.finish()[0] == 0


def test_outside_the_main_thread_is_a_value_error():
    caught: list[BaseException] = []

    def run():
        try:
            checkpoint.on_preempt(lambda notice: None)
        except BaseException as e:  # noqa: BLE001 - reported to the main thread
            caught.append(e)

    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    [error] = caught
    assert isinstance(error, ValueError) and "main thread" in str(error)
    assert signal.getsignal(signal.SIGTERM) is before
    with pytest.raises(TypeError):
        checkpoint.on_preempt("torch.save")


# --- inside the images --------------------------------------------------------------


def test_imports_the_standard_library_only():
    tree = ast.parse((ROOT / "spawner" / "notebook" / "checkpoint.py").read_text())
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    ours = {m for m in modules if m.split(".")[0] == "spawner"}
    assert {m.split(".")[0] for m in modules - ours} <= set(sys.stdlib_module_names) | {
        "__future__"}
    assert ours == {"spawner.contract"}
    # the documented name, as a notebook imports it
    code = ("import sys, json; import spawner.checkpoint; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('spawner'))))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, cwd=ROOT)
    assert json.loads(result.stdout) == ["spawner", "spawner.checkpoint", "spawner.contract",
                                         "spawner.notebook", "spawner.notebook.checkpoint"]
