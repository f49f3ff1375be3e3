"""The two images, built for real by `make images` (podman + runc, offline) and run as the chart runs them.

Never skipped: where podman cannot build or run a container, these tests fail with the reason. The first
run on a machine builds the base, the wheelhouses and both images (many minutes: the fixture's timeout is
long); every later run finds them in the per-machine cache by content and starts containers only. A
Dockerfile change that breaks an image (a missing package, a wrong entry point, a root user) fails here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_testbed.images import space
from llm_testbed.images.podman import Podman
from llm_testbed.images.recipe import KEEP_BUILT
from llm_testbed.localcluster.tools import ensure

from tests.support.images import Containers, entrypoint_flags, make_images, pod_flags
from tests.support.wait import wait_for

pytestmark = [pytest.mark.images, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "elastic-llm-operator"
CONSTRAINTS = ROOT / "images" / "trainer" / "constraints.txt"
PROBE = (
    "import sys, urllib.error, urllib.request\n"
    "try:\n"
    "    r = urllib.request.urlopen(sys.argv[1], timeout=5); print(r.status, r.read().decode())\n"
    "except urllib.error.HTTPError as e:\n"
    "    print(e.code, e.read().decode())\n"
)


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    refs, _ = make_images()
    assert set(refs) == {"operator", "trainer"}, refs
    return refs


@pytest.fixture(scope="module")
def containers() -> Iterator[Containers]:
    running = Containers()
    yield running
    running.close()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The chart's operator Deployment, rendered with its default values."""
    home = tmp_path_factory.mktemp("helm")
    env = {**os.environ, **{f"HELM_{d}_HOME": str(home / d.lower()) for d in ("CONFIG", "CACHE", "DATA")}}
    argv = [str(ensure(["helm"])["helm"]), "template", "ship", str(CHART), "--namespace", "llm-system"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, env=env, timeout=120).stdout
    (found,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment"]
    return found


def _uid(user: str) -> int:
    """The numeric UID of an image's configured user; fails for a name (runAsNonRoot needs a number)."""
    uid = user.split(":")[0]
    assert uid.isdigit(), f"the image's user {user!r} is not numeric: kubelet cannot check runAsNonRoot"
    return int(uid)


def test_a_second_make_images_builds_nothing(images: dict[str, str]) -> None:
    refs, progress = make_images()
    assert refs == images
    lines = progress.strip().splitlines()
    assert len(lines) == 1 and "up to date, nothing to build" in lines[0], progress


def test_a_new_build_first_removes_older_images_of_its_repository(images: dict[str, str]) -> None:
    store = Podman.of_cache()
    repository = "localhost/elastic-llm-operator/room-test"
    source = images["operator"]
    for n in range(3):
        subprocess.run(store.argv("tag", source, f"{repository}:old{n}"), check=True, timeout=60)
    try:
        space.make_room(store, repository, need=0)
        assert len(store.tags(repository)) == KEEP_BUILT - 1
        space.make_room(store, repository, need=space.free() + 2**50)
        assert store.tags(repository) == []
        assert store.image_exists(source), "removing a tag must leave an image other tags still name"
    finally:
        for tag in store.tags(repository):
            store.remove(tag)


def test_operator_image_has_a_non_root_user_and_its_entry_point(
    images: dict[str, str], containers: Containers
) -> None:
    config = containers.podman.inspect(images["operator"])["Config"]
    assert _uid(config.get("User", "")) != 0
    assert config["Entrypoint"] == ["llmjob", "operator"]
    # The image's own user and entry point, no flags: `llmjob operator --help`.
    proc = containers.run(images["operator"], "--help")
    assert proc.returncode == 0, proc.stderr
    assert "--liveness-port" in proc.stdout
    whoami = containers.run(
        images["operator"], "-c", "import os; print(os.getuid())", flags=["--entrypoint", "python"]
    )
    assert whoami.returncode == 0 and int(whoami.stdout) == _uid(config["User"]), whoami.stderr


def test_operator_serves_its_probes_under_the_charts_security_context(
    images: dict[str, str], containers: Containers, deployment: dict[str, Any], tmp_path: Path
) -> None:
    """The chart's command, args, user, read-only root, dropped capabilities and /tmp; /healthz answers.

    No API server is reachable (the kubeconfig names a closed port), so the operator stays in its start-up
    checks: live (/healthz 200) and not ready (/readyz 503), as it is in a cluster before the CRDs exist.
    """
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    ctx = {**spec["securityContext"], **container["securityContext"]}
    assert ctx["runAsNonRoot"] and ctx["readOnlyRootFilesystem"] and ctx["capabilities"]["drop"] == ["ALL"]
    entry, args = entrypoint_flags(container)
    kube = tmp_path / "kube"
    kube.mkdir()
    (kube / "config").write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "none", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "none", "user": {}}],
                "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}],
                "current-context": "none",
            }
        )
    )
    kube.chmod(0o755)
    (kube / "config").chmod(0o644)
    extra = ["-v", f"{kube}:/kube:ro", "--env", "KUBECONFIG=/kube/config", "--env", "POD_ID=ship-operator-0"]
    name = f"llmjob-test-operator-{os.getpid()}"
    user = containers.podman.inspect(images["operator"])["Config"].get("User", "")
    flags = [*pod_flags(spec, container, user), *entry, *extra]
    containers.start(name, images["operator"], *args, flags=flags)

    ports = {p["name"]: p["containerPort"] for p in container["ports"]}

    def probe(kind: str) -> tuple[int, dict[str, Any]] | None:
        httpget = container[kind]["httpGet"]
        url = f"http://127.0.0.1:{ports.get(httpget['port'], httpget['port'])}{httpget['path']}"
        proc = containers.exec(name, "python", "-c", PROBE, url)
        if proc.returncode != 0:
            if not containers.running(name):
                log = containers.logs(name)[-3000:]
                pytest.fail(f"the operator exited before its {kind} answered; its log:\n{log}", pytrace=False)
            return None
        status, _, body = proc.stdout.partition(" ")
        return int(status), json.loads(body)

    live = wait_for(lambda: probe("livenessProbe"), 90, "the operator's liveness endpoint to answer")
    assert live[0] == 200, live
    assert live[1]["state"] == "starting", live
    ready = probe("readinessProbe")
    assert ready is not None and ready[0] == 503, ready
    user = containers.exec(name, "id", "-u")
    assert user.stdout.strip() == str(ctx["runAsUser"])
    assert containers.exec(name, "touch", "/probe").returncode != 0, "the root file system is read-only"
    assert containers.exec(name, "touch", "/tmp/probe").returncode == 0, "/tmp is the writable emptyDir"
    assert containers.running(name), containers.logs(name)
    log = containers.logs(name)
    assert "Traceback" not in log and "Read-only file system" not in log, log


def test_trainer_image_imports_the_trainer_as_its_user_on_a_read_only_root(
    images: dict[str, str], containers: Containers
) -> None:
    config = containers.podman.inspect(images["trainer"])["Config"]
    uid = _uid(config.get("User", ""))
    assert uid != 0
    worker = ["--read-only", "--read-only-tmpfs=false", "--cap-drop", "ALL", "--cap-add", "IPC_LOCK"]
    worker += ["--security-opt", "no-new-privileges", "--shm-size", "256m"]
    # prometheus_client: every worker's metrics endpoint (without it a worker serves none, silently).
    modules = "os, torch, llm_elastic, llm_trainer, prometheus_client"
    script = f"import {modules}; print(os.getuid(), torch.__version__)"
    proc = containers.run(images["trainer"], "python", "-c", script, flags=worker)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got_uid, torch_version = proc.stdout.split()
    pinned = re.search(r"^torch==(\S+)", CONSTRAINTS.read_text(), re.MULTILINE)
    assert pinned is not None
    assert (int(got_uid), torch_version.split("+")[0]) == (uid, pinned.group(1))


def test_trainer_image_default_command_and_recorded_versions(
    images: dict[str, str], containers: Containers
) -> None:
    proc = containers.run(images["trainer"])  # CMD: torchrun --help
    assert proc.returncode == 0 and "torchrun" in proc.stdout, proc.stderr[-3000:]
    env = dict(e.split("=", 1) for e in containers.podman.inspect(images["trainer"])["Config"]["Env"])
    # The local build has no CUDA base, EFA or aws-ofi-nccl, and says so; the Python pins are in the image.
    assert env["LLMJOB_IMAGE_VERSIONS"].startswith("cuda=none efa=none aws-ofi-nccl=none"), env
    assert "python-pins=/opt/llmjob/constraints.txt" in env["LLMJOB_IMAGE_VERSIONS"]
