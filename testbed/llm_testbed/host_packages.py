"""Host commands the project needs, installed from Debian's packages when they are missing.

Like the Go tools, the project installs what it needs itself: the image builder (podman, runc, mmdebstrap)
and the alert tests (promtool, from the ``prometheus`` package) find a command missing and run
``apt-get install`` for its package (root only), once per machine. Installs take one lock in the cache, so
the image build that CI starts in the background and a test that needs promtool never run apt-get at the
same time. Where installing is impossible, :class:`HostPackageError` says in one line what to install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from llm_testbed.localcluster.errors import LocalClusterError
from llm_testbed.localcluster.filelock import locked
from llm_testbed.localcluster.paths import cache_root

Run = Callable[[str, Sequence[str], Mapping[str, str]], object]
"""Runs one install command: (what, argv, environment); raises when it fails."""


class HostPackageError(LocalClusterError):
    """A host command is missing and cannot be installed here; the message says what to install."""


def missing_packages(
    commands: Mapping[str, str], which: Callable[[str], str | None] | None = None
) -> list[str]:
    """The Debian packages (``commands``: command -> package) whose command is not on PATH, sorted."""
    find = which or shutil.which
    return sorted({package for command, package in commands.items() if find(command) is None})


def install_argv(packages: Sequence[str]) -> list[list[str]]:
    """The apt-get commands that install ``packages`` (an index refresh first: a new machine has none)."""
    return [["apt-get", "update"], ["apt-get", "install", "-y", *packages]]


def ensure_commands(commands: Mapping[str, str], run: Run, say: Callable[[str], None]) -> None:
    """Install the packages of the missing ``commands`` with ``run``, or raise HostPackageError saying why
    that cannot be done here."""
    if not missing_packages(commands):
        return
    with locked(cache_root() / "host-packages.lock", lambda: say("waiting for another apt-get install")):
        packages = missing_packages(commands)  # another process may have installed them meanwhile
        if not packages:
            return
        names = " ".join(packages)
        if shutil.which("apt-get") is None:
            raise HostPackageError(
                f"{names} not installed and no apt-get here: install them with your package manager"
            )
        if os.geteuid() != 0:
            raise HostPackageError(
                f"{names} not installed: run `sudo apt-get install {names}` (installing needs root)"
            )
        say(f"installing {names} from Debian's packages (once per machine)")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for argv in install_argv(packages):
            run(f"host: {' '.join(argv[:2])}", argv, env)
        still = missing_packages(commands)
        if still:
            raise HostPackageError(
                f"apt-get installed {names}, yet {' '.join(still)} still has no command on PATH"
            )


def logged_run(log_dir: Path, say: Callable[[str], None]) -> Run:
    """A :data:`Run` that writes each command's output to ``log_dir/host-<verb>.log`` and raises
    HostPackageError naming the command, its exit status, the log's last lines and its path."""

    def run(what: str, argv: Sequence[str], env: Mapping[str, str]) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        log = log_dir / f"host-{argv[1]}.log"
        say(f"{what}: started (log: {log})")
        with log.open("w") as out:
            code = subprocess.call(
                list(argv), env=dict(env), stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
        if code != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-10:])
            raise HostPackageError(f"{what}: {argv[0]} exited {code} (log: {log}):\n{tail}")
        say(f"{what}: done")

    return run
