"""The one way the homes' mechanisms run a command (btrfs, xfs_quota, setquota, mkfs.ext4,
mount …): with a time-out, in the C locale (the reports are parsed), and with an error
that names the command, its exit code and what it wrote to stderr.

``CommandRunner`` is also the boundary the tests fake for the project-quota tools, which
this kernel cannot run (tests/fake_quota_tools.py): every mechanism takes a ``runner``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from spawner.homes.errors import HomeError

DEFAULT_TIMEOUT = 60.0
STDERR_SHOWN = 600  # characters of stderr kept in an error: the end, where the reason is


class Runner(Protocol):
    def __call__(self, argv: Sequence[str], *, timeout: float | None = None,
                 ok: Collection[int] = (0,)) -> str: ...


class CommandError(HomeError):
    """A command failed: it could not start, ran past its time-out, or exited with a code
    not in ``ok``. ``returncode`` is None when it never finished."""

    def __init__(self, argv: Sequence[str], returncode: int | None, stderr: str, why: str):
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        text = stderr.strip()
        if len(text) > STDERR_SHOWN:
            text = "…" + text[-STDERR_SHOWN:]
        super().__init__(f"`{shlex.join(self.argv)}` {why}" + (f": {text}" if text else ""))

    @classmethod
    def exited(cls, argv: Sequence[str], returncode: int, stderr: str) -> CommandError:
        return cls(argv, returncode, stderr, f"failed with exit code {returncode}")

    @classmethod
    def missing(cls, argv: Sequence[str]) -> CommandError:
        return cls(argv, None, "", f"could not run: {argv[0]} is not installed (or not on "
                   "the PATH)")


@dataclass(frozen=True)
class CommandRunner:
    """Runs ``argv`` (never through a shell) and returns its stdout."""

    timeout: float = DEFAULT_TIMEOUT

    def __call__(self, argv: Sequence[str], *, timeout: float | None = None,
                 ok: Collection[int] = (0,)) -> str:
        limit = self.timeout if timeout is None else timeout
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}  # English, parseable reports
        try:
            done = subprocess.run(list(argv), capture_output=True, text=True, errors="replace",
                                  timeout=limit, env=env, stdin=subprocess.DEVNULL, check=False)
        except FileNotFoundError:
            raise CommandError.missing(argv) from None
        except PermissionError as e:
            raise CommandError(argv, None, "", f"could not run: {e.strerror}") from None
        except subprocess.TimeoutExpired as e:
            stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else \
                (e.stderr or "")
            raise CommandError(argv, None, stderr, f"timed out after {limit:g} s") from None
        if done.returncode not in ok:
            raise CommandError.exited(argv, done.returncode, done.stderr)
        return done.stdout
