"""Logging for the driver and the workers, with secrets masked at every level."""

from __future__ import annotations

import logging
import sys

from streamstone_py import RedactSecrets

__all__ = ["FORMAT", "configure"]

FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def configure(level: str) -> None:
    """Root logging at ``level`` on stderr; every handler masks secrets.

    At DEBUG, urllib3 logs each request line, SAS signature included: the
    filter sits on the root's handlers, so it sees every logger's records.
    """
    logging.basicConfig(level=level, stream=sys.stderr, format=FORMAT)
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactSecrets) for f in handler.filters):
            handler.addFilter(RedactSecrets())
