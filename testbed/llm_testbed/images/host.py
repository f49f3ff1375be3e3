"""The host commands the image build needs, installed from Debian's packages when they are missing.

``make images`` on a fresh Debian or Ubuntu machine finds podman, runc or mmdebstrap missing and runs
``apt-get install`` for them (root only; :mod:`llm_testbed.host_packages`). Where that is impossible it
stops with one line that says what to install.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from llm_testbed import host_packages
from llm_testbed.images.errors import ImageError
from llm_testbed.images.podman import images_root
from llm_testbed.images.steps import report, run_step

COMMANDS: dict[str, str] = {"podman": "podman", "runc": "runc", "mmdebstrap": "mmdebstrap"}
"""Command -> the Debian package that provides it."""

install_argv = host_packages.install_argv


def missing_packages(which: Callable[[str], str | None] | None = None) -> list[str]:
    """The Debian packages whose command is not on PATH (``which``: shutil.which), in a stable order."""
    return host_packages.missing_packages(COMMANDS, which)


def _run(what: str, argv: Sequence[str], env: Mapping[str, str]) -> None:
    run_step(what, argv, images_root() / "logs" / f"host-{argv[1]}.log", env=env)


def ensure_commands() -> None:
    """Install the missing host packages, or raise ImageError saying why that cannot be done here."""
    try:
        host_packages.ensure_commands(COMMANDS, _run, report)
    except host_packages.HostPackageError as exc:
        raise ImageError(str(exc)) from None
