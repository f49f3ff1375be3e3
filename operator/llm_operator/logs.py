"""The operator's log lines: text, or one JSON object per line (``llmjob operator --log-format json``).

JSON is kopf's own formatter (``kopf.configure(log_format=kopf.LogFormat.JSON)``): ``timestamp`` (ISO 8601,
UTC), ``severity`` (debug, info, warn, error, fatal), ``message`` and, on a job's records (those logged
through the handler's ``logger``), ``object`` with the job's ``apiVersion``, ``kind``, ``namespace``, ``name``
and ``uid``. We add ``logger`` (the Python logger's name). The runtime's JSON lines
(``llm_elastic.logs``) use the same names, so one parser reads both.
"""

from __future__ import annotations

import logging

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
OBJECT_KEY = "object"
"""Where kopf puts the job's reference in a JSON line."""


def _with_logger_name(record: logging.LogRecord) -> bool:
    record.logger = record.name  # kopf's JSON formatter writes every extra attribute as a field
    return True


def configure_logging(level: str, fmt: str) -> None:
    """One handler on the root logger, in ``fmt`` (text or json), at ``level`` (debug, info, ...)."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: must be one of {', '.join(FORMATS)}")
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    if fmt == "json":
        import kopf  # here, so that the command line reads FORMATS without importing kopf

        kopf.configure(log_format=kopf.LogFormat.JSON, log_refkey=OBJECT_KEY)
        for handler in root.handlers:
            handler.addFilter(_with_logger_name)
    else:
        logging.basicConfig(format=TEXT_FORMAT)
    root.setLevel(getattr(logging, level.upper()))
