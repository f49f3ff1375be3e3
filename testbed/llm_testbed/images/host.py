"""The host commands the image build needs, installed from Debian's packages when they are missing.

Like the Go tools, the project installs what it needs itself: ``make images`` on a fresh Debian or Ubuntu
machine finds podman, runc or mmdebstrap missing and runs ``apt-get install`` for them (root only). Where
that is impossible it stops with one line that says what to install.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable

from llm_testbed.images.errors import ImageError
from llm_testbed.images.podman import images_root
from llm_testbed.images.steps import report, run_step

COMMANDS: dict[str, str] = {"podman": "podman", "runc": "runc", "mmdebstrap": "mmdebstrap"}
"""Command -> the Debian package that provides it."""


def missing_packages(which: Callable[[str], str | None] | None = None) -> list[str]:
    """The Debian packages whose command is not on PATH (``which``: shutil.which), in a stable order."""
    find = which or shutil.which
    return sorted({package for command, package in COMMANDS.items() if find(command) is None})


def install_argv(packages: list[str]) -> list[list[str]]:
    """The apt-get commands that install ``packages`` (an index refresh first: a new machine has none)."""
    return [["apt-get", "update"], ["apt-get", "install", "-y", *packages]]


def ensure_commands() -> None:
    """Install the missing host packages, or raise ImageError saying why that cannot be done here."""
    packages = missing_packages()
    if not packages:
        return
    names = " ".join(packages)
    if shutil.which("apt-get") is None:
        raise ImageError(f"{names} not installed and no apt-get here: install them with your package manager")
    if os.geteuid() != 0:
        raise ImageError(f"{names} not installed: run `sudo apt-get install {names}` (installing needs root)")
    report(f"installing {names} from Debian's packages (once per machine)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    logs = images_root() / "logs"
    for argv in install_argv(packages):
        run_step(f"host: {' '.join(argv[:2])}", argv, logs / f"host-{argv[1]}.log", env=env)
    still = missing_packages()
    if still:
        raise ImageError(f"apt-get installed {names}, yet {' '.join(still)} still has no command on PATH")
