"""The runtime's one exit path: a part that decides the process must go raises :class:`Leave`; only
``Elastic.steps()`` turns it into "leave the membership, then exit with the code".

``Leave`` is a ``BaseException`` (like the ``SystemExit`` it becomes), so no ``except Exception`` on the
way out (a membership callback, the generation loop's own handlers) swallows it.
"""

from __future__ import annotations


class Leave(BaseException):  # a verdict, not an error
    """Leave the job and end the process with exit status ``code`` (``cause``: the exception chained)."""

    def __init__(self, code: int, cause: BaseException | None = None) -> None:
        super().__init__(code)
        self.code = code
        self.cause = cause
