"""Save a checkpoint when this server is preempted.

When a user with a higher-priority role needs a GPU this server holds, the hub
may preempt the server: it writes a notice into the container, sends SIGTERM
to the kernels and to every process that asked for it, and stops the server
when the grace period ends (your home folder is kept). A kernel that did
nothing dies at the SIGTERM. One that called :func:`on_preempt` runs its
callback instead, and can save its work. See docs/preemption.md.

One line in a notebook::

    from spawner.notebook.checkpoint import on_preempt
    on_preempt(lambda notice: torch.save(model.state_dict(), "ckpt.pt"))

PyTorch, in a training script or a notebook::

    import torch
    from spawner.notebook.checkpoint import on_preempt, seconds_left

    def save(notice):
        # notice: the hub's notice (who needs the GPU, why, the deadline), or None
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "epoch": epoch}, "checkpoint.pt")
        print(f"checkpoint saved, {seconds_left() or 0:.0f} s before the stop")

    on_preempt(save)              # a notebook: the kernel stays, you see the output
    # on_preempt(save, exit=True) # a script: exit (status 0) once it is saved

PaddlePaddle::

    import paddle
    from spawner.notebook.checkpoint import on_preempt

    def save(notice):
        paddle.save(model.state_dict(), "model.pdparams")
        paddle.save(optimizer.state_dict(), "model.pdopt")

    on_preempt(save)

Resume with ``torch.load`` / ``paddle.load`` after you start the server again.

How it behaves:

- The callback runs in the main thread, between two Python bytecodes. A long
  C call (a CUDA kernel, a ``time.sleep``) finishes first, so keep the grace
  period in mind (``seconds_left()``) and save only what you need.
- It runs once per notice: a second SIGTERM while it runs, or for the same
  notice, is ignored. An exception in it is printed, not raised into your
  code.
- ``exit=False`` (the default): the process goes on afterwards; SIGTERM no
  longer ends it, the server's stop does. ``exit=True``: ``os._exit(0)``
  after the callback, ``os._exit(1)`` if it raised (``sys.exit`` would not
  end a Jupyter kernel, which catches SystemExit); other ``atexit`` handlers
  then do not run.
- A Python-level SIGTERM handler that was set before is called after the
  callback. Calling ``on_preempt`` again replaces the earlier callback
  (re-running a cell does not save twice); to do several things, do them in
  one callback.
- A forked child (a DataLoader worker) does not run the callback: SIGTERM
  acts there as it did before ``on_preempt``.

Standard library only: it is imported inside notebook kernels.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import stat
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from spawner.contract import PREEMPT_NOTICE, PREEMPT_PIDS_DIR

__all__ = ["on_preempt", "notice", "seconds_left", "read_notice"]

# Module attributes, read at each use, so tests can point them elsewhere.
NOTICE = PREEMPT_NOTICE
PIDS_DIR = PREEMPT_PIDS_DIR

NOTICE_VERSION = 1
# A notice is a few hundred bytes; anything far bigger is not one.
MAX_NOTICE_BYTES = 64 * 1024

Notice = dict[str, Any]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if value == value and abs(value) != float("inf") else None


def parse_notice(data: bytes | str) -> Notice | None:
    """The notice in ``data``, with known fields only and their types checked.

    None unless it is a JSON object of version 1 with a numeric ``deadline``
    (a partial write is not). A field of the wrong type becomes null (``gpus``:
    the strings in it), so the page always has something to show.
    """
    try:
        raw = json.loads(data)
    except ValueError:  # also UnicodeDecodeError
        return None
    if not isinstance(raw, dict) or raw.get("version") != NOTICE_VERSION:
        return None
    deadline = _number(raw.get("deadline"))
    if deadline is None:
        return None
    def text(key: str) -> str | None:
        return raw[key] if isinstance(raw.get(key), str) else None

    gpus = raw.get("gpus")
    return {  # the hub's order
        "version": NOTICE_VERSION,
        "by": text("by"),
        "by_role": text("by_role"),
        "role": text("role"),
        "gpus": [g for g in gpus if isinstance(g, str)] if isinstance(gpus, list) else [],
        "reason": text("reason"),
        "signalled_at": _number(raw.get("signalled_at")),
        "deadline": deadline,
        "grace_period": _number(raw.get("grace_period")),
    }


def read_notice(path: str | None = None) -> Notice | None:
    """The notice at ``path`` (default ``NOTICE``); None when there is none or it is
    unreadable, not a regular file, too big, or not a valid notice.

    Cheap: an open, an fstat and one small read. Non-blocking, so a FIFO at the
    path cannot hang the caller (the GPU monitor reads it on its event loop).
    """
    try:
        fd = os.open(NOTICE if path is None else path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, MAX_NOTICE_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return parse_notice(data) if len(data) <= MAX_NOTICE_BYTES else None


def notice() -> Notice | None:
    """The current preemption notice; None when this server is not being preempted."""
    return read_notice()


def seconds_left(current: Notice | None = None, *, now: float | None = None) -> float | None:
    """Seconds until the server is stopped (0 once the deadline has passed); None
    without a notice. ``current``: a notice already read (default: read it now)."""
    if current is None:
        current = read_notice()
    if current is None:
        return None
    return max(0.0, current["deadline"] - (time.time() if now is None else now))


# --- on_preempt -------------------------------------------------------------------


class _State:
    callback: Callable[[Notice | None], Any] | None = None
    exit = False
    previous: Any = None  # the SIGTERM handler before ours
    pid: int | None = None  # the process that called on_preempt
    pid_file: str | None = None
    running = False
    done_for: Any = ()  # the key of the notice the callback last ran for; () = never


_state = _State()
_atexit_registered = False


def _notice_key(current: Notice | None) -> Any:
    return None if current is None else json.dumps(current, sort_keys=True)


def _register_pid() -> None:
    """Leave PIDS_DIR/<pid>, so that the hub signals this process. Never raises:
    without it, a kernel is still signalled; a script is not."""
    global _atexit_registered
    path = os.path.join(PIDS_DIR, str(os.getpid()))
    try:
        # 0o700: only the notebook user (and the hub's step, run as that user) lists it.
        os.makedirs(os.path.dirname(PIDS_DIR), mode=0o700, exist_ok=True)
        os.makedirs(PIDS_DIR, mode=0o700, exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    except OSError:
        return
    _state.pid_file = path
    if not _atexit_registered:
        atexit.register(_unregister_pid)
        _atexit_registered = True


def _unregister_pid() -> None:
    # Only the process that wrote it: a forked child exiting leaves it alone.
    if _state.pid_file is None or _state.pid != os.getpid():
        return
    try:
        os.unlink(_state.pid_file)
    except OSError:
        pass
    _state.pid_file = None


def _chain(signum: int, frame: Any) -> None:
    previous = _state.previous
    if callable(previous):
        previous(signum, frame)


def _on_sigterm(signum: int, frame: Any) -> None:
    if os.getpid() != _state.pid:
        # A forked child: behave as before on_preempt.
        if callable(_state.previous):
            _state.previous(signum, frame)
        elif _state.previous != signal.SIG_IGN:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        return
    if _state.running:
        return  # a second SIGTERM while the callback runs
    current = read_notice()
    key = _notice_key(current)
    if key == _state.done_for:
        return  # already handled this notice (the hub may signal a kernel twice)
    _state.running = True
    status = 0
    try:
        try:
            if _state.callback is not None:
                _state.callback(current)
        except Exception:
            status = 1
            print("on_preempt: the callback failed:", file=sys.stderr)
            traceback.print_exc()
        _state.done_for = key
        _chain(signum, frame)
    finally:
        _state.running = False
        if _state.exit:
            _exit(status)


def _exit(status: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or odd stream must not keep the process alive
            pass
    _unregister_pid()
    os._exit(status)


def on_preempt(callback: Callable[[Notice | None], Any], *, exit: bool = False) -> None:
    """Call ``callback(notice)`` when this server is preempted (at the hub's SIGTERM).

    ``notice`` is the hub's notice as a dict (``by``, ``by_role``, ``role``,
    ``gpus``, ``reason``, ``signalled_at``, ``deadline``, ``grace_period``), or
    None when the SIGTERM came without one. With ``exit=True`` the process
    ends after the callback (status 0, or 1 if it raised); by default it goes on.

    Call it from the main thread (a notebook cell is): Python runs signal
    handlers there only. Elsewhere it raises ValueError.
    """
    if not callable(callback):
        raise TypeError(f"on_preempt needs a callable, not {type(callback).__name__}")
    if threading.current_thread() is not threading.main_thread():
        raise ValueError("on_preempt() must be called from the main thread: Python runs "
                         "signal handlers there only (in a notebook, call it in a cell)")
    current = signal.getsignal(signal.SIGTERM)
    pid = os.getpid()
    if current is not _on_sigterm or _state.pid != pid:
        # Not ours yet (or only inherited through fork): remember what to chain to.
        _state.previous = current if current is not _on_sigterm else _state.previous
        _state.done_for = ()
        _state.running = False
    _state.callback = callback
    _state.exit = exit
    _state.pid = pid
    signal.signal(signal.SIGTERM, _on_sigterm)
    _register_pid()
