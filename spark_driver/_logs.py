"""Logging for the driver and the workers, with secrets masked at every level."""

from __future__ import annotations

import logging
import os
import sys

from streamstone_py import RedactSecrets

__all__ = ["FORMAT", "configure"]

FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


class _QuietPy4J(logging.Filter):
    """Py4J logs its own traceback, some of it through the root logger, when
    Ctrl-C or a failed job cuts a call short; the command says what happened
    in one line, so below DEBUG those records are dropped."""

    _DIR = f"{os.sep}py4j{os.sep}"

    def filter(self, record: logging.LogRecord) -> bool:
        return self._DIR not in record.pathname


def configure(level: str) -> None:
    """Root logging at ``level`` on stderr; every handler masks secrets.

    At DEBUG, urllib3 logs each request line, SAS signature included: the
    filter sits on the root's handlers, so it sees every logger's records.
    """
    logging.basicConfig(level=level, stream=sys.stderr, format=FORMAT)
    for handler in logging.getLogger().handlers:
        if level != "DEBUG" and not any(isinstance(f, _QuietPy4J) for f in handler.filters):
            handler.addFilter(_QuietPy4J())
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactSecrets) for f in handler.filters):
            handler.addFilter(RedactSecrets())
