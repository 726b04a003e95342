"""Structured JSON logs carrying the request id. ``configure`` is called by the CLI only."""

from __future__ import annotations

import contextvars
import logging
import sys
import time
from typing import Any, Final

import orjson

request_id: Final[contextvars.ContextVar[str | None]] = contextvars.ContextVar(
    "kvgate_request_id", default=None
)

_STD_ATTRS: Final = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, request_id, any ``extra=`` fields, exception."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = request_id.get()
        if rid is not None:
            out["request_id"] = rid
        out.update({k: v for k, v in vars(record).items() if k not in _STD_ATTRS and not k.startswith("_")})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def configure(level: str = "INFO", *, json: bool = True) -> None:
    """Set up the root logger once, for a process started from the CLI."""
    handler = logging.StreamHandler(sys.stderr)
    if json:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.Formatter.converter = time.gmtime
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
