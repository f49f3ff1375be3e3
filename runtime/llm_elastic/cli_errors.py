"""argparse with one-line errors: ``prog: error: message (see --help)`` on stderr, exit code 2."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

USAGE_ERROR = 2


class ExitOnErrorParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are a single line naming the option, without the usage block."""

    def error(self, message: str) -> NoReturn:
        """Print ``prog: error: message`` and exit 2."""
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(USAGE_ERROR)


def usage_error(prog: str, message: str) -> NoReturn:
    """Report a bad option found after parsing (same format and exit code as the parser)."""
    print(f"{prog}: error: {message} (see --help)", file=sys.stderr)
    raise SystemExit(USAGE_ERROR)
