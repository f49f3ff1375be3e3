"""The built images in tests: `make images` (cached), and a container started the way a pod spec says.

``make_images()`` runs the real target (``make -s images PYTHON=<this Python>``): the first run on a
machine builds (many minutes), later ones find every image in the cache and return at once. A failure
fails the test with the builder's own message and log tail, never a skip.

``pod_flags(pod_spec, container, image_user)`` turns the parts of a rendered pod spec that decide how a
process may behave into ``podman run`` flags: the security context through the pod runner's own translation
(``llm_testbed.podrunner.security``: user and group, read-only root file system, capabilities, no privilege
escalation...), emptyDir volumes as size-limited tmpfs, literal env. What it does not cover it refuses, so
a chart change cannot be silently ignored by the test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from llm_testbed.images.podman import Podman, ulimit_flags
from llm_testbed.podrunner.plan import byte_size
from llm_testbed.podrunner.security import security_flags, security_of

ROOT = Path(__file__).resolve().parents[2]


def make_images() -> tuple[dict[str, str], str]:
    """``make images`` for real: the ``name -> reference`` it printed, and its progress output (stderr)."""
    proc = subprocess.run(
        ["make", "-s", "images", f"PYTHON={sys.executable}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"make images failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}", pytrace=False)
    refs = dict(line.split(maxsplit=1) for line in proc.stdout.splitlines() if line.strip())
    return refs, proc.stderr


def pod_flags(pod_spec: dict[str, Any], container: dict[str, Any], image_user: str) -> list[str]:
    """``podman run`` flags for the container's security context (the pod runner's own translation, as
    its container mode runs a pod), its emptyDir volumes and literal env."""
    name = str(container.get("name"))
    flags = security_flags(security_of({"spec": pod_spec}, container), image_user, name)
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if set(volume) - {"name"} != {"emptyDir"}:
            raise AssertionError(f"pod_flags covers emptyDir volumes only, not {volume}")
        size = (volume["emptyDir"] or {}).get("sizeLimit")
        where = f"volume {mount['name']}: emptyDir.sizeLimit"
        options = "rw,mode=1777" + (f",size={byte_size(where, str(size))}" if size else "")
        flags += ["--tmpfs", f"{mount['mountPath']}:{options}"]
    for env in container.get("env", []):
        if "value" in env:
            flags += ["--env", f"{env['name']}={env['value']}"]
    return flags


class Containers:
    """podman (the builder's storage, runc) for tests: run to the end, or start and exec; removes its own."""

    def __init__(self) -> None:
        self.podman = Podman.of_cache()
        self.started: list[str] = []

    def _argv(self, *args: str) -> list[str]:
        return self.podman.argv(*args)

    def run(
        self, image: str, *args: str, flags: Sequence[str] = (), timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        argv = self._argv("run", "--rm", "--network", "none", *ulimit_flags(), *flags, image, *args)
        return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)

    def start(self, name: str, image: str, *args: str, flags: Sequence[str] = ()) -> None:
        self.remove(name)
        argv = self._argv(
            "run", "--detach", "--name", name, "--network", "none", *ulimit_flags(), *flags, image, *args
        )
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
        assert proc.returncode == 0, f"podman run --detach {image} failed:\n{proc.stderr}"
        self.started.append(name)

    def exec(self, name: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self._argv("exec", name, *args), capture_output=True, text=True, check=False, timeout=60
        )

    def logs(self, name: str) -> str:
        proc = subprocess.run(
            self._argv("logs", name), capture_output=True, text=True, check=False, timeout=60
        )
        return proc.stdout + proc.stderr

    def running(self, name: str) -> bool:
        proc = subprocess.run(
            self._argv("inspect", "--format", "{{.State.Running}}", name),
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        return proc.stdout.strip() == "true"

    def remove(self, name: str) -> None:
        subprocess.run(
            self._argv("rm", "--force", "--time", "2", name), capture_output=True, check=False, timeout=120
        )

    def close(self) -> None:
        for name in self.started:
            self.remove(name)


def entrypoint_flags(container: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The pod's ``command`` as ``--entrypoint`` (JSON, as podman takes a list), and its ``args``."""
    flags = ["--entrypoint", json.dumps(container["command"])] if container.get("command") else []
    return flags, list(container.get("args", []))
