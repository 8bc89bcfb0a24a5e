"""Something that can keep failing (a database, an engine, a file), told once.

A duty that runs every few seconds must not flood the log while the ledger is down: an
``OutageLog`` logs the failure when it starts, again only when its error changes, and once
when the thing works again (the outage ends). Blocking or not, it holds no lock: one
owner calls it.
"""

from __future__ import annotations

import logging
from typing import Any

Log = logging.Logger | logging.LoggerAdapter


class OutageLog:
    """``failed`` logs ``message`` at ``level`` when ``error`` is new; ``works`` logs its
    message once after a failure. ``error`` is the last error, "" while it works."""

    def __init__(self, level: int = logging.WARNING):
        self.level = level
        self.error = ""

    def failed(self, log: Log, error: object, message: str, *args: Any) -> None:
        if str(error) != self.error:
            log.log(self.level, message, *args)
            self.error = str(error)

    def works(self, log: Log, message: str, *args: Any) -> None:
        if self.error:
            log.info(message, *args)
            self.error = ""
