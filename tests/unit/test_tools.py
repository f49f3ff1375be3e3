"""tools.py: cache keys, the envtest conventions, errors that say what to do. Builds nothing."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import pytest
from llm_testbed.localcluster import tools


def _fake_binary(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LLMJOB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    for name in tools.ALL_TOOLS:
        monkeypatch.delenv("TEST_ASSET_" + name.upper().replace("-", "_"), raising=False)


def test_every_tool_belongs_to_exactly_one_group() -> None:
    names = [name for group in tools.GROUPS for name in group.commands]
    assert sorted(names) == sorted(set(names)) == sorted(tools.ALL_TOOLS)
    assert {"kube-apiserver", "kubectl", "etcd", "kwok", "kwokctl", "helm"} <= set(names)


def test_every_group_has_a_pinned_wrapper_module() -> None:
    for group in tools.GROUPS:
        gomod = (group.module_dir / "go.mod").read_text()
        assert (group.module_dir / "go.sum").is_file(), group.name
        assert group.version.lstrip("v") in gomod or group.name == "kubernetes", group.name


def test_cache_dir_is_keyed_by_version_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tools, "_go_version", lambda: "go1.26.0")
    group = tools.GROUPS[1]
    first = tools.group_dir(group)
    assert first.parent == tools.cache_root() / "tools"
    assert first.name.startswith(f"{group.name}-{group.version}-")
    assert tools.group_dir(dataclasses.replace(group, toolchain="go1.27.4")) != first
    machines_go = dataclasses.replace(group, toolchain="")  # a group without a toolchain of its own
    before = tools.group_dir(machines_go)
    monkeypatch.setattr(tools, "_go_version", lambda: "go1.27.0")
    assert tools.group_dir(machines_go) != before
    assert tools.group_dir(group) == first


def test_cache_dir_is_keyed_by_the_wrappers_own_go_sources(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    module = tmp_path / "tools" / "x"
    (module / "cmd" / "x").mkdir(parents=True)
    for name in ("go.mod", "go.sum"):
        (module / name).write_text(f"{name}\n")
    main = module / "cmd" / "x" / "main.go"
    main.write_text("package main\n")
    group = tools.ToolGroup("x", "v1", {"x": "./cmd/x"})
    monkeypatch.setattr(tools.ToolGroup, "module_dir", property(lambda self: module))
    first = tools.group_dir(group)
    main.write_text("package main\n\nfunc main() {}\n")
    assert tools.group_dir(group) != first


def test_test_asset_variable_wins_and_nothing_is_built(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    binary = _fake_binary(tmp_path / "bin" / "my-apiserver")
    monkeypatch.setenv("TEST_ASSET_KUBE_APISERVER", str(binary))
    monkeypatch.setattr(tools, "_build_group", lambda *a: pytest.fail("must not build"))
    assert tools.ensure(["kube-apiserver"]) == {"kube-apiserver": binary}


def test_kubebuilder_assets_folder_is_used(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("etcd", "kube-apiserver", "kubectl"):
        _fake_binary(tmp_path / "assets" / name)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path / "assets"))
    found = tools.ensure(["etcd", "kube-apiserver", "kubectl"])
    assert found == {name: tmp_path / "assets" / name for name in ("etcd", "kube-apiserver", "kubectl")}
    assert {i.source for i in tools.describe(["etcd"])} == {"env"}


def test_bad_test_asset_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_ASSET_ETCD", "/nonexistent/etcd")
    with pytest.raises(tools.ToolError, match=r"TEST_ASSET_ETCD=/nonexistent/etcd is not an executable file"):
        tools.ensure(["etcd"])


def test_unknown_tool_is_a_clear_error() -> None:
    with pytest.raises(tools.ToolError, match="unknown tool 'kube-nothing'; known tools: "):
        tools.ensure(["kube-nothing"])


def test_missing_go_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(tools.ToolError, match="'go' is not on PATH"):
        tools.ensure(["etcd"])


def test_describe_reports_missing_tools_with_their_pinned_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tools, "_go_version", lambda: "go1.26.0")
    infos = {i.name: i for i in tools.describe()}
    assert infos["kube-apiserver"].version == tools.KUBE_VERSION
    assert infos["etcd"].version == tools.ETCD_VERSION
    assert infos["kwokctl"].version == tools.KWOK_VERSION
    assert {i.source for i in infos.values()} == {"missing"}


def test_bin_dir_links_every_tool(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    binary = _fake_binary(tmp_path / "real" / "kubectl")
    folder = tools.bin_dir_for({"kubectl": binary})
    assert (folder / "kubectl").resolve() == binary.resolve()
    assert os.access(folder / "kubectl", os.X_OK)


def test_only_the_tool_build_runs_go() -> None:
    """What a test or the local cluster needs from a pinned module (Kueue's CRDs and webhooks, Karpenter's
    and Argo CD's CRDs) is copied at build time (``ToolGroup.files``): a machine whose Go module cache was
    deleted after the build, as the README allows, still runs every tier. Only the build and the pins tool
    may call the go command."""
    root = Path(tools.__file__).resolve().parents[2]
    callers = sorted(
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if any(call in path.read_text() for call in ('["go",', "go_binary(),", 'which("go")'))
    )
    assert callers == ["llm_testbed/localcluster/pins.py", "llm_testbed/localcluster/tools.py"]
    kueue = next(g for g in tools.GROUPS if g.name == "kueue")
    assert {f.into for f in kueue.files} == {"crds", "webhook"}
