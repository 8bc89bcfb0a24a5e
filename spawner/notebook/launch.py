"""The notebook images' ``jupyterhub-singleuser``: JupyterHub's own server, then a fast exit.

A notebook server asked to stop (SIGTERM from ``docker stop``) shuts its kernels,
terminals and extensions down in about 15 ms. The interpreter then tears down the
1,400 modules the server imported, which takes 0.35 s of CPU: on a 2-core host,
24 servers of a class stopped at once spend 4 s on nothing but that. So once the
server's own clean-up is done, this ends the process the way the interpreter
would, minus the teardown: it waits for non-daemon threads, runs the ``atexit``
handlers (logging flushes its handlers there), flushes stdout and stderr, and
calls ``os._exit`` with the exit status ``sys.exit`` would have given.

What is skipped is only the destruction of objects still alive at exit: a file
object left open with unflushed writes loses them, as in any ``os._exit``. The
server writes its files with context managers; kernels are other processes, shut
down by the server before this runs.

The images install this as ``/opt/notebook/bin/jupyterhub-singleuser``, so every
spawner that runs the images' command (QuotaSpawner, DockerSpawner, KubeSpawner)
gets it; ``docs/images.md``.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import traceback
from collections.abc import Callable
from typing import NoReturn

__all__ = ["main", "run", "exit_status"]


def exit_status(code: object) -> int:
    """The process status ``sys.exit(code)`` gives: None is 0, an int is itself (the
    low 8 bits, as the OS keeps them), anything else is printed to stderr and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):  # bool too: sys.exit(True) is 1
        return int(code) & 0xFF
    print(code, file=sys.stderr)
    return 1


def _finish() -> None:
    # What Py_FinalizeEx does before the teardown, in its order: join the non-daemon
    # threads (and run threading's own exit hooks, concurrent.futures' among them),
    # then the atexit handlers.
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass


def run(entry: Callable[[], object]) -> NoReturn:
    """Call ``entry``, then end the process with its status and without the teardown.

    ``entry`` returning ``x`` ends as ``sys.exit(x)`` would; ``SystemExit`` likewise;
    any other exception (KeyboardInterrupt included) is printed with its traceback,
    as the interpreter would, and gives status 1 (130 for KeyboardInterrupt)."""
    try:
        status = exit_status(entry())
    except SystemExit as exc:
        status = exit_status(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        status = 130
    except BaseException:  # noqa: BLE001 (printed, and the status says it failed)
        traceback.print_exc()
        status = 1
    try:
        _finish()
    except BaseException:  # noqa: BLE001 (an exit hook's failure must not hang the exit)
        traceback.print_exc()
        status = status or 1
    os._exit(status)


def main() -> NoReturn:
    """``jupyterhub-singleuser`` with its usual arguments."""
    from jupyterhub.singleuser import main as singleuser_main

    run(singleuser_main)
