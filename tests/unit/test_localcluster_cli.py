"""The cluster/tools/chaos commands: documented flags, one-line errors, no traceback. Starts nothing."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml
from llm_testbed.localcluster import chaos, cli, kind, paths, tools
from llm_testbed.localcluster.kubectl import Kubectl


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LLMJOB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LLMJOB_DEBUG", raising=False)


@pytest.fixture
def fake_tools(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Path]:
    """ensure() answers with paths that are never run (the commands must fail before using them)."""
    fake = {name: tmp_path / "bin" / name for name in tools.ALL_TOOLS}
    monkeypatch.setattr(tools, "ensure", lambda names=tools.ALL_TOOLS: {n: fake[n] for n in names})
    return fake


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    return err


def test_parser_knows_the_documented_flags() -> None:
    parser = cli.build_parser()
    up = parser.parse_args(
        ["cluster", "up", "--nodes", "8", "--cpu-nodes", "3", "--name", "x", "--port", "7443"]
    )
    assert (up.nodes, up.cpu_nodes, up.name, up.port, up.kind) == (8, 3, "x", 7443, False)
    assert parser.parse_args(["cluster", "up"]).name == "llmjob"
    assert parser.parse_args(["cluster", "up", "--kind"]).kind is True
    assert parser.parse_args(["cluster", "up", "--run-pods"]).run_pods is True
    assert parser.parse_args(["cluster", "up"]).run_pods is False
    assert parser.parse_args(["cluster", "down", "--all"]).all is True
    assert parser.parse_args(["cluster", "status"]).func is cli.cmd_cluster_status
    assert parser.parse_args(["tools", "build", "etcd"]).tools == ["etcd"]
    assert parser.parse_args(["tools", "list"]).func is cli.cmd_tools_list
    taint = parser.parse_args(["chaos", "taint", "gpu-node-1", "--kind", "spot"])
    assert (taint.action, taint.node, taint.kind) == ("taint", "gpu-node-1", "spot")
    fail = parser.parse_args(["chaos", "fail-pod", "w-0", "-n", "ns", "--exit-code", "137"])
    assert (fail.pod, fail.namespace, fail.exit_code) == ("w-0", "ns", 137)


def test_register_adds_commands_to_an_existing_cli() -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="llmjob")
    sub = parser.add_subparsers(dest="command")
    cli.register(sub)
    assert parser.parse_args(["cluster", "down", "--name", "a"]).func is cli.cmd_cluster_down


@pytest.mark.parametrize(
    "argv", [["cluster", "down", "--name", "a", "--all"], ["cluster", "up", "--nodes", "-1"]]
)
def test_bad_arguments_are_rejected(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(argv)
    assert exc.value.code == 2


def test_port_in_use_is_a_one_line_error(
    fake_tools: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        code = cli.main(["cluster", "up", "--name", "port-test", "--port", str(port)])
    assert code == 1
    err = _one_line_error(capsys)
    assert f"port {port} on 127.0.0.1 is not free" in err


def test_missing_binary_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TEST_ASSET_KUBE_APISERVER", "/nonexistent/kube-apiserver")
    assert cli.main(["cluster", "up", "--name", "missing-binary"]) == 1
    assert (
        "TEST_ASSET_KUBE_APISERVER=/nonexistent/kube-apiserver is not an executable file"
        in _one_line_error(capsys)
    )


def test_missing_go_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert cli.main(["tools", "build", "etcd"]) == 1
    assert "'go' is not on PATH" in _one_line_error(capsys)


def test_down_and_status_of_a_missing_cluster(
    fake_tools: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["cluster", "down", "--name", "never-made"]) == 0
    assert "cluster never-made: does not exist, nothing to do" in capsys.readouterr().out
    assert cli.main(["cluster", "down", "--all"]) == 0
    assert "no local clusters" in capsys.readouterr().out
    assert cli.main(["cluster", "status", "--name", "never-made"]) == 1
    assert "cluster never-made: does not exist" in capsys.readouterr().out
    assert cli.main(["cluster", "kubeconfig", "--name", "never-made"]) == 1
    assert "run `llmjob cluster up --name never-made`" in _one_line_error(capsys)


def test_invalid_cluster_name_is_a_one_line_error(
    fake_tools: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["cluster", "up", "--name", "../etc"]) == 1
    assert "invalid cluster name '../etc'" in _one_line_error(capsys)


def test_tools_list_shows_versions_and_builds_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tools, "_go_version", lambda: "go1.26.0")
    monkeypatch.setattr(tools, "_build_group", lambda *a: pytest.fail("must not build"))
    assert cli.main(["tools", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(tools.ALL_TOOLS)
    by_name = {line.split()[0]: line.split() for line in lines}
    assert by_name["kube-apiserver"][1:3] == [tools.KUBE_VERSION, "missing"]
    assert by_name["kwokctl"][1] == tools.KWOK_VERSION


def test_kind_without_docker_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    fake_tools: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert cli.main(["cluster", "up", "--kind"]) == 1
    assert "--kind needs `kind` on PATH" in _one_line_error(capsys)


def test_chaos_without_cluster_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, fake_tools: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert cli.main(["chaos", "node-not-ready", "gpu-node-0"]) == 1
    assert "cluster llmjob does not exist and KUBECONFIG is not set" in _one_line_error(capsys)


def test_fail_pod_rejects_impossible_exit_codes_before_calling_the_cluster(tmp_path: Path) -> None:
    kube = Kubectl(tmp_path / "no-kubectl", tmp_path / "no-kubeconfig")
    with pytest.raises(chaos.LocalClusterError, match=r"exit code must be within 0\.\.255, got 300"):
        chaos.fail_pod("ns", "pod", 300, kube=kube)


def test_termination_taints() -> None:
    assert chaos.termination_taint("karpenter") == {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}
    spot = chaos.termination_taint("spot")
    assert (spot["key"], spot["effect"]) == ("aws-node-termination-handler/spot-itn", "NoSchedule")
    cordon = chaos.termination_taint("cordon")
    assert cordon == {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    with pytest.raises(chaos.LocalClusterError, match="unknown termination kind 'reboot'"):
        chaos.termination_taint("reboot")  # type: ignore[arg-type]


def test_committed_kind_config_matches_the_generator() -> None:
    committed = paths.repo_root() / "deploy" / "local" / "kind" / "kind-config.yaml"
    assert committed.read_text() == kind.render("llmjob", 2, 1)
    config = yaml.safe_load(committed.read_text())
    workers = [n for n in config["nodes"] if n["role"] == "worker"]
    assert [w["labels"]["node.kubernetes.io/instance-type"] for w in workers] == [
        "p5.48xlarge",
        "p5.48xlarge",
        "m5.2xlarge",
    ]
    assert "nvidia.com/gpu" in workers[0]["kubeadmConfigPatches"][0]
