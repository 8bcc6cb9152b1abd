"""Log setup shared by dyad-master and dyad-agent: `--log-format text|json`.

`json` writes one JSON object per line (``time``, ``level``, ``logger``,
``message``, plus ``exception`` with the traceback when there is one), so log
shippers can index the fields without a parsing rule. Text stays the default for
people reading a terminal.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One line of JSON per record; never raises on odd arguments (they are
    rendered with `%` first, like the text format does, then escaped by json)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC)
                    .isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(level: str, log_format: str) -> None:
    """Send the root logger to stderr at `level` in `log_format` (see FORMATS)."""
    if log_format not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
