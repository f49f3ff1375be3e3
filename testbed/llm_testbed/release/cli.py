"""``make release`` / ``python -m llm_testbed.release``: progress on stderr, the folder's contents on
stdout, a failure as one line on stderr with exit status 1 (``LLMJOB_DEBUG=1`` shows the traceback)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from llm_testbed.localcluster.errors import LocalClusterError
from llm_testbed.localcluster.paths import repo_root
from llm_testbed.release.build import make_release
from llm_testbed.release.folder import summary


def one_line(message: str) -> str:
    """The first line of a message, and its last one (where a step's log is) when it has more."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()] or ["(no message)"]
    return lines[0] if len(lines) == 1 else f"{lines[0]} {lines[-1]}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llm_testbed.release", description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=None, help="folder of releases (default: dist/release in the checkout)"
    )
    parser.add_argument(
        "--save-images",
        action="store_true",
        help="also write both images as OCI archives into images/ (the trainer's is several GB)",
    )
    parser.add_argument(
        "--no-sbom-validation",
        action="store_true",
        help="skip cyclonedx-py's schema check of each SBOM (about 8 s of CPU each)",
    )
    args = parser.parse_args(argv)
    try:
        root = repo_root()
        final = make_release(
            root,
            args.out or root / "dist" / "release",
            save_images=args.save_images,
            validate_sboms=not args.no_sbom_validation,
        )
    except (LocalClusterError, OSError, ValueError, subprocess.SubprocessError) as exc:
        if os.environ.get("LLMJOB_DEBUG"):
            raise
        print(f"make release: error: {one_line(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("make release: interrupted", file=sys.stderr)
        return 130
    print(f"{final}:")
    print("\n".join(summary(final)))
    return 0
