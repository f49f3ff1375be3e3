"""Log lines of a worker: text, or one JSON object per line when ``LLMJOB_LOG_FORMAT=json``.

:func:`configure_logging` is what a program calls once at its start (the reference trainer's CLI does):
it puts one stream handler on the root logger, so the runtime's own records (``llm_elastic.*``) and the
program's come out the same way. The JSON fields are those of the operator's JSON logs (kopf's):
``timestamp`` (ISO 8601, UTC), ``severity`` (debug, info, warn, error, fatal), ``logger``, ``message``, and,
where known, ``job`` and ``pod`` (from the operator's ``LLMJOB_JOB_NAME`` / ``LLMJOB_POD_NAME``),
``generation`` and ``step`` (the runtime updates them as they change: :func:`set_context`), and
``exception`` (the traceback) on records that carry one. Standard library only: no torch, no extra package.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
from collections.abc import Mapping
from typing import IO, Any

from llm_elastic.contract import LOG_FORMAT_ENV as FORMAT_ENV
from llm_elastic.errors import contract_error

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_context: dict[str, Any] = {}
"""What the JSON lines say about where they come from (job, pod, generation, step)."""


def set_context(**fields: Any) -> None:
    """Update the fields every JSON line carries (a value of None removes the field)."""
    for key, value in fields.items():
        if value is None:
            _context.pop(key, None)
        else:
            _context[key] = value


def severity(levelno: int) -> str:
    """kopf's severity names, so operator and worker lines read alike."""
    if levelno <= logging.DEBUG:
        return "debug"
    if levelno <= logging.INFO:
        return "info"
    if levelno <= logging.WARNING:
        return "warn"
    return "error" if levelno <= logging.ERROR else "fatal"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "timestamp": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(),
            "severity": severity(record.levelno),
            "logger": record.name,
            "message": record.getMessage(),
            **_context,
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def log_format(env: Mapping[str, str] | None = None) -> str:
    """``text`` or ``json`` from ``LLMJOB_LOG_FORMAT`` (default text); ContractError on anything else."""
    value = (os.environ if env is None else env).get(FORMAT_ENV, "").strip().lower() or "text"
    if value not in FORMATS:
        contract_error(f"{FORMAT_ENV}={value!r}: must be one of {', '.join(FORMATS)}")
    return value


def make_formatter(fmt: str, text_format: str = TEXT_FORMAT) -> logging.Formatter:
    """The formatter of ``fmt`` (``text``: ``text_format``)."""
    return JsonFormatter() if fmt == "json" else logging.Formatter(text_format)


def configure_logging(
    level: int | str = logging.INFO,
    *,
    text_format: str = TEXT_FORMAT,
    env: Mapping[str, str] | None = None,
    stream: IO[str] | None = None,
) -> str:
    """One handler on the root logger in the format ``LLMJOB_LOG_FORMAT`` asks for; returns that format.

    Replaces the root logger's handlers (a second call reconfigures rather than doubling every line), and
    takes the job, the pod and torchelastic's restart count (the generation, in restart mode) from ``env``."""
    source = os.environ if env is None else env
    fmt = log_format(source)
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(make_formatter(fmt, text_format))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    restarts = source.get("TORCHELASTIC_RESTART_COUNT")
    set_context(
        job=source.get("LLMJOB_JOB_NAME") or None,
        pod=source.get("LLMJOB_POD_NAME") or None,
        generation=int(restarts) if restarts and restarts.isdigit() else None,
    )
    return fmt
