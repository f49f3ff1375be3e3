"""Build and cache the pinned upstream binaries of the local control plane.

Each upstream project is built from a small Go wrapper module that we own under
``deploy/local/tools/<group>/`` (its ``go.mod``/``go.sum`` pin the version). The binaries land in a
per-machine cache keyed by a hash of the wrapper module, the Go version and the build flags, so a
version bump rebuilds and nothing is ever committed. A file lock makes concurrent runs wait for one
build instead of racing. The envtest convention is honoured: ``TEST_ASSET_<NAME>`` or
``KUBEBUILDER_ASSETS`` pointing at existing binaries wins and nothing is built.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from llm_testbed.localcluster.errors import LocalClusterError
from llm_testbed.localcluster.filelock import locked
from llm_testbed.localcluster.paths import cache_root, repo_root
from llm_testbed.localcluster.progress import say

KUBE_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v4.3.1"
KUEUE_VERSION = "v0.17.1"
KARPENTER_VERSION = "v1.15.0"
DISTRIBUTION_VERSION = "v3.1.2"
CONTAINERD_VERSION = "v2.4.2"
COREDNS_VERSION = "v1.15.0"
ARGOCD_VERSION = "v3.6.1"
# Every group builds with this one Go toolchain, which the go command fetches through the Go module proxy
# (about 76 MB, once per machine) because GOTOOLCHAIN names it: Karpenter's go.mod asks for Go >= 1.26.9 and
# Argo CD's for 1.27, and the Go build cache reuses a package compiled for one group in another only when the
# same compiler built it (docs/decisions.md, "CI6: one version of each shared module").
GO_TOOLCHAIN = "go1.27.3"


def _kube_ldflags() -> list[str]:
    major, minor = KUBE_VERSION.lstrip("v").split(".")[:2]
    flags: list[str] = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={KUBE_VERSION}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
        ]
    return flags


@dataclass(frozen=True)
class ModuleFiles:
    """Files of a pinned module copied into the group's cache folder at build time (never into the repo)."""

    module: str  # module path, as go.mod requires it
    globs: tuple[str, ...]  # relative to the module's root
    into: str  # folder under the group's cache folder


@dataclass(frozen=True)
class ToolGroup:
    """One wrapper module and the commands built from it in a single ``go build``."""

    name: str
    version: str
    commands: dict[str, str]  # binary name -> Go package path
    ldflags: list[str] = field(default_factory=list)
    toolchain: str = GO_TOOLCHAIN  # GOTOOLCHAIN for this group ("" = the machine's Go)
    files: tuple[ModuleFiles, ...] = ()
    tags: tuple[str, ...] = ()  # go build -tags

    @property
    def module_dir(self) -> Path:
        return repo_root() / "deploy" / "local" / "tools" / self.name


# In the order a cold machine needs them: etcd for the trainer tier, the control plane for the cluster tiers,
# helm for the chart tier, then the registry, Kueue and Karpenter that a few tests need (``build_order``).
GROUPS: tuple[ToolGroup, ...] = (
    ToolGroup("etcd", ETCD_VERSION, {"etcd": "./cmd/etcd"}),
    ToolGroup(
        "kubernetes",
        KUBE_VERSION,
        {
            "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
            "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
            "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
            "kubectl": "k8s.io/kubernetes/cmd/kubectl",
        },
        _kube_ldflags(),
    ),
    ToolGroup(
        "kwok",
        KWOK_VERSION,
        {"kwok": "sigs.k8s.io/kwok/cmd/kwok", "kwokctl": "sigs.k8s.io/kwok/cmd/kwokctl"},
        [
            f"-X sigs.k8s.io/kwok/pkg/consts.Version={KWOK_VERSION.lstrip('v')}",
            f"-X sigs.k8s.io/kwok/pkg/consts.KubeVersion={KUBE_VERSION.lstrip('v')}",
        ],
    ),
    ToolGroup(
        "helm",
        HELM_VERSION,
        {"helm": "helm.sh/helm/v4/cmd/helm"},
        [f"-X helm.sh/helm/v4/internal/version.version={HELM_VERSION}"],
    ),
    ToolGroup(
        "distribution",
        DISTRIBUTION_VERSION,
        {"registry": "github.com/distribution/distribution/v3/cmd/registry"},
        [f"-X github.com/distribution/distribution/v3/version.version={DISTRIBUTION_VERSION}"],
    ),
    ToolGroup(
        "kueue",
        KUEUE_VERSION,
        {"kueue": "sigs.k8s.io/kueue/cmd/kueue"},
        [f"-X sigs.k8s.io/kueue/pkg/version.GitVersion={KUEUE_VERSION}"],
        # Its CRDs and admission webhooks, copied at build time: the Go module cache may be deleted after.
        files=(
            ModuleFiles("sigs.k8s.io/kueue", ("config/components/crd/bases/*.yaml",), "crds"),
            ModuleFiles("sigs.k8s.io/kueue", ("config/components/webhook/manifests.yaml",), "webhook"),
        ),
    ),
    ToolGroup(
        "karpenter",
        KARPENTER_VERSION,
        {"karpenter": "sigs.k8s.io/karpenter/kwok"},
        [f"-X sigs.k8s.io/karpenter/pkg/operator.Version={KARPENTER_VERSION}"],
        files=(
            ModuleFiles(
                "sigs.k8s.io/karpenter",
                ("pkg/apis/crds/*.yaml", "kwok/apis/crds/*.yaml"),
                "crds",
            ),
        ),
    ),
    # The kubelet node tier (llm_testbed.kubeletnodes): built only for `cluster up --kubelet` and its tests.
    ToolGroup(
        "containerd",
        CONTAINERD_VERSION,
        {
            "containerd": "github.com/containerd/containerd/v2/cmd/containerd",
            "containerd-shim-runc-v2": "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
            "ctr": "github.com/containerd/containerd/v2/cmd/ctr",
            "pause": "./cmd/pause",
        },
        [f"-X github.com/containerd/containerd/v2/version.Version={CONTAINERD_VERSION}"],
        # No cgo (CGO_ENABLED=0 as every group): the btrfs snapshotter needs it; devmapper and zfs are unused.
        tags=("no_btrfs", "no_devmapper", "no_zfs"),
    ),
    ToolGroup(
        "kubenode",
        KUBE_VERSION,
        {"kubelet": "k8s.io/kubernetes/cmd/kubelet", "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy"},
        _kube_ldflags(),
    ),
    ToolGroup("coredns", COREDNS_VERSION, {"coredns": "./cmd/coredns"}),
    # Argo CD core (llm_testbed.argocd): one binary of our own (the wrapper's cmd/argocd) that acts as
    # argocd-application-controller or argocd-repo-server by ARGOCD_BINARY_NAME, linking only those two of
    # Argo CD's components; built only for `cluster up --argocd` and the argocd tests.
    ToolGroup(
        "argocd",
        ARGOCD_VERSION,
        {"argocd": "./cmd/argocd"},
        [f"-X github.com/argoproj/argo-cd/v3/common.version={ARGOCD_VERSION.lstrip('v')}"],
        files=(
            ModuleFiles("github.com/argoproj/argo-cd/v3", ("manifests/crds/*-crd.yaml",), "crds"),
            # The repo server runs it for every commit it renders, GPG or not (Argo CD's image has it).
            ModuleFiles("github.com/argoproj/argo-cd/v3", ("hack/git-verify-wrapper.sh",), "hack"),
        ),
    ),
)

ALL_TOOLS: tuple[str, ...] = tuple(name for g in GROUPS for name in g.commands)


class ToolError(LocalClusterError):
    """A tool could not be found or built; the message says what to do."""


def _group_of(tool: str) -> ToolGroup:
    for group in GROUPS:
        if tool in group.commands:
            return group
    raise ToolError(f"unknown tool {tool!r}; known tools: {', '.join(ALL_TOOLS)}")


def go_binary() -> str:
    """The ``go`` command on PATH, or a ToolError that says to install Go."""
    go = shutil.which("go")
    if go is None:
        raise ToolError("'go' is not on PATH: install Go >= 1.24 to build the local control plane tools")
    return go


def _go_version() -> str:
    out = subprocess.run([go_binary(), "env", "GOVERSION"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _toolchain_version(group: ToolGroup) -> str:
    """The Go that builds ``group``: its pinned toolchain (not asked for: that would fetch it) or ours."""
    return group.toolchain or _go_version()


def go_env(group: ToolGroup) -> dict[str, str]:
    """The environment of every ``go`` command run in ``group``'s wrapper module."""
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly"}
    if group.toolchain:
        env["GOTOOLCHAIN"] = group.toolchain
    return env


def _build_flags(group: ToolGroup) -> list[str]:
    tags = ["-tags", ",".join(group.tags)] if group.tags else []
    return ["-trimpath", *tags, "-ldflags", " ".join(["-s", "-w", *group.ldflags])]


def group_dir(group: ToolGroup) -> Path:
    """The cache folder of one group: keyed by version, wrapper module, Go version and flags."""
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum"):
        digest.update((group.module_dir / name).read_bytes())
    for source in sorted(group.module_dir.rglob("*.go")):  # the wrapper's own commands (etcd's, Argo CD's)
        digest.update(f"{source.relative_to(group.module_dir)}\n".encode() + source.read_bytes())
    digest.update(_toolchain_version(group).encode())
    digest.update(" ".join(_build_flags(group)).encode())
    for files in group.files:
        digest.update(f"{files.module} {' '.join(files.globs)} {files.into}".encode())
    return cache_root() / "tools" / f"{group.name}-{group.version}-{digest.hexdigest()[:12]}"


def _from_environment(tool: str) -> Path | None:
    """The envtest convention: an explicit asset path or a KUBEBUILDER_ASSETS folder."""
    env_name = "TEST_ASSET_" + tool.upper().replace("-", "_")
    explicit = os.environ.get(env_name)
    if explicit:
        path = Path(explicit)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ToolError(f"{env_name}={explicit} is not an executable file")
        return path
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        path = Path(assets) / tool
        if path.is_file() and os.access(path, os.X_OK):
            return path
    return None


def _say(message: str) -> None:
    say("tools", message)


def _count_packages(group: ToolGroup, env: dict[str, str]) -> int:
    """How many packages ``go build`` may compile: the denominator of the progress line."""
    result = subprocess.run(
        [go_binary(), "list", "-deps", *group.commands.values()],
        cwd=group.module_dir,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    return max(1, len(result.stdout.splitlines())) if result.returncode == 0 else 1


DOWNLOAD_ATTEMPTS = 3


def _download_modules(group: ToolGroup, env: dict[str, str], log_path: Path) -> None:
    """``go mod download``, tried again on failure: module downloads of large groups time out at times."""
    for attempt in range(1, DOWNLOAD_ATTEMPTS + 1):
        with log_path.open("w") as log:
            code = subprocess.run(
                [go_binary(), "mod", "download"],
                cwd=group.module_dir,
                env=env,
                stdout=log,
                stderr=log,
                check=False,
            ).returncode
        if code == 0:
            return
        _say(f"go mod download of {group.name} failed (try {attempt}/{DOWNLOAD_ATTEMPTS}): {log_path}")
    raise ToolError(f"go mod download of {group.name} failed {DOWNLOAD_ATTEMPTS} times (log: {log_path})")


def _build_group(group: ToolGroup, log_dir: Path) -> None:
    target = group_dir(group)
    if all((target / name).is_file() for name in group.commands):
        return
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    env = go_env(group)
    _download_modules(group, env, log_dir / f"download-{group.name}.log")
    total = _count_packages(group, env)
    log_path = log_dir / f"build-{group.name}.log"
    argv = [
        go_binary(),
        "build",
        "-v",
        *_build_flags(group),
        "-o",
        str(staging) + "/",
        *group.commands.values(),
    ]
    _say(f"building {group.name} {group.version} ({', '.join(group.commands)}): log in {log_path}")
    started = time.monotonic()
    compiled = 0
    last_report = started
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            argv, cwd=group.module_dir, env=env, stdout=log, stderr=subprocess.PIPE, text=True
        )
        assert proc.stderr is not None
        for line in proc.stderr:
            log.write(line)
            compiled += 1
            now = time.monotonic()
            if now - last_report >= 15:
                last_report = now
                pct = min(99, 100 * compiled // total)
                _say(f"{group.name}: ~{pct}% ({compiled} packages compiled, {int(now - started)}s elapsed)")
        code = proc.wait()
    elapsed = time.monotonic() - started
    if code != 0:
        lines = [line for line in log_path.read_text().splitlines() if line.strip()]
        last = lines[-1] if lines else "(no output)"
        raise ToolError(
            f"building {group.name} {group.version} failed (exit {code}): {last} (log: {log_path})"
        )
    with log_path.open("a") as log:
        log.write(f"# built {group.name} {group.version} in {elapsed:.0f}s ({compiled} packages compiled)\n")
    for name, package in group.commands.items():  # go build names a binary after its package's folder
        built = staging / package.rstrip("/").rsplit("/", 1)[-1]
        if built.name != name:
            built.rename(staging / name)
    for files in group.files:
        _copy_module_files(group, files, staging / files.into, env)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    _say(f"built {group.name} in {int(elapsed)}s -> {target}")


def module_root(group: ToolGroup, module: str, env: dict[str, str] | None = None) -> Path:
    """Where the pinned ``module`` of ``group`` lies in the Go module cache (downloaded by the build)."""
    result = subprocess.run(
        [go_binary(), "list", "-m", "-f", "{{.Dir}}", module],
        cwd=group.module_dir,
        env=env or go_env(group),
        capture_output=True,
        text=True,
        check=False,
    )
    path = Path(result.stdout.strip())
    if result.returncode != 0 or not result.stdout.strip() or not path.is_dir():
        why = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "not in the module cache"
        raise ToolError(f"cannot locate module {module} of the {group.name} tools: {why}")
    return path


def _copy_module_files(group: ToolGroup, files: ModuleFiles, dest: Path, env: dict[str, str]) -> None:
    root = module_root(group, files.module, env)
    dest.mkdir(parents=True, exist_ok=True)
    copied = 0
    for pattern in files.globs:
        for path in sorted(root.glob(pattern)):
            shutil.copyfile(path, dest / path.name)
            copied += 1
    if copied == 0:
        raise ToolError(f"no file of {files.module} matches {', '.join(files.globs)} (looked in {root})")


def files_dir(tool: str, into: str) -> Path:
    """The folder of module files (``ModuleFiles.into``) that the build of ``tool``'s group copied."""
    ensure([tool])
    folder = group_dir(_group_of(tool)) / into
    if not folder.is_dir():
        raise ToolError(f"{folder} is missing: `llmjob tools build {tool}` copies it")
    return folder


def build_order(groups: Iterable[ToolGroup]) -> list[ToolGroup]:
    """``groups`` in the order a cold machine needs them: ``GROUPS`` order (first tiers first)."""
    names = {g.name for g in groups}
    return [g for g in GROUPS if g.name in names]


def _lock_path(group: ToolGroup) -> Path:
    return cache_root() / "tools" / ".locks" / f"{group.name}.lock"


def ensure(tools: Iterable[str] = ALL_TOOLS) -> dict[str, Path]:
    """Return the path of each tool, building the missing groups one after another, each under its lock.

    One group at a time: two cores build one group in about the time they build two side by side, the
    groups share the Go build cache (a dependency compiled for one is reused by the next), and the tools
    the first test tiers need are ready first. The lock is per group, so a caller that needs etcd waits
    for etcd alone, never for Karpenter (docs/decisions.md, "Cold set-up on two cores").
    """
    wanted = list(tools)
    found: dict[str, Path] = {}
    missing_groups: dict[str, ToolGroup] = {}
    for tool in wanted:
        from_env = _from_environment(tool)
        if from_env is not None:
            found[tool] = from_env
            continue
        group = _group_of(tool)
        path = group_dir(group) / tool
        if path.is_file():
            found[tool] = path
        else:
            missing_groups[group.name] = group
    if missing_groups:
        go_binary()  # no Go: one clear error before anything is announced or made
        log_dir = cache_root() / "tools" / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        _say(f"building the local control plane tools this machine lacks: {', '.join(missing_groups)}")
        for group in build_order(missing_groups.values()):
            waiting = f"another process is building {group.name}; waiting for it"
            with locked(_lock_path(group), lambda: _say(waiting)):  # noqa: B023 - used before the loop moves on
                _build_group(group, log_dir)
        for tool in wanted:
            found.setdefault(tool, group_dir(_group_of(tool)) / tool)
    return found


def bin_dir_for(paths: dict[str, Path]) -> Path:
    """A folder of symlinks to every tool, for PATH and for kwokctl's binary runtime."""
    target = cache_root() / "bin"
    target.mkdir(parents=True, exist_ok=True)
    for name, path in paths.items():
        link = target / name
        if link.is_symlink() or link.exists():
            if link.resolve() == path.resolve():
                continue
            link.unlink()
        link.symlink_to(path)
    return target


@dataclass(frozen=True)
class ToolInfo:
    """One tool as ``llmjob tools list`` shows it."""

    name: str
    version: str
    path: Path
    source: str  # "built" | "missing" | "env"


def describe(tools: Iterable[str] = ALL_TOOLS) -> list[ToolInfo]:
    """Where each tool is (or would be) and which pinned version it is; builds nothing."""
    infos = []
    for tool in tools:
        group = _group_of(tool)
        from_env = _from_environment(tool)
        if from_env is not None:
            infos.append(ToolInfo(tool, group.version, from_env, "env"))
            continue
        path = group_dir(group) / tool
        infos.append(ToolInfo(tool, group.version, path, "built" if path.is_file() else "missing"))
    return infos


def main(argv: list[str] | None = None) -> int:
    """``python -m llm_testbed.localcluster.tools [build|list] [TOOL...]``: standard library only.

    Lets CI start the (long) cold build before the virtualenv exists:
    ``PYTHONPATH=operator python3 -m llm_testbed.localcluster.tools build &``.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    action = args.pop(0) if args else "build"
    names = args or list(ALL_TOOLS)
    try:
        if action == "build":
            ensure(names)
        elif action != "list":
            raise ToolError(f"unknown action {action!r}: use build or list")
        for info in describe(names):
            print(f"{info.name:<24} {info.version:<9} {info.source:<8} {info.path}")
    except ToolError as exc:
        print(f"tools: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
