"""Which tools a test waits for before its timeout starts, and the order of the integration tier's files
(tests/support/tools_first.py)."""

from __future__ import annotations

import pytest
from support.tools_first import IMAGES_RANK, build_order, groups_for, ready_rank, tools_for


def test_each_tier_waits_for_its_own_tools_and_an_integration_test_for_the_groups_it_names() -> None:
    e2e = tools_for("tests/integration/test_e2e_live.py::t", {"cluster", "trainer"})
    kubelet = tools_for("tests/integration/test_kubelet_tier.py::t", {"cluster"}, ["containerd", "kubenode"])
    argocd = tools_for("tests/integration/test_argocd.py::t", {"cluster"}, ["kueue", "argocd"])
    assert {"kube-apiserver", "kubectl", "kwok", "etcd", "helm"} <= set(e2e)
    assert not {"karpenter", "kueue", "kubelet", "argocd", "registry"} & set(e2e)
    assert {"containerd", "kubelet", "kube-apiserver"} <= set(kubelet) and "argocd" not in kubelet
    assert {"argocd", "kueue"} <= set(argocd) and "kubelet" not in argocd
    assert tools_for("tests/chart/test_x.py::t", {"cluster"})[-1] == "helm"
    assert tools_for("tests/trainer/test_x.py::t", {"trainer"}) == ("etcd",)
    assert tools_for("tests/unit/test_x.py::t", set()) == ()


def test_a_mark_naming_an_unknown_group_is_refused_with_the_test_and_the_name() -> None:
    with pytest.raises(ValueError, match=r"test_x.py::t: .*\['kubeflow'\]"):
        groups_for("tests/integration/test_x.py::t", {"cluster"}, ["kubeflow"])


@pytest.mark.parametrize(
    ("nodeid", "markers"),
    [("tests/integration/test_x.py::t", {"trainer"}), ("tests/chart/test_x.py::t", {"cluster"})],
)
def test_a_mark_that_would_be_ignored_is_refused(nodeid: str, markers: set[str]) -> None:
    with pytest.raises(ValueError, match=r"test_x.py::t: pytest.mark.tools needs an integration test marked"):
        groups_for(nodeid, markers, ["kueue"])


def test_files_run_in_the_order_their_last_tool_is_built_and_image_files_last() -> None:
    def rank(*named: str) -> int:
        return ready_rank(groups_for("tests/integration/x.py::t", {"cluster"}, named), images=False)

    core, kueue, argocd = rank(), rank("kueue"), rank("argocd", "kueue")
    assert core < kueue < argocd < IMAGES_RANK == ready_rank((), images=True)
    assert ready_rank((), images=False) < core  # a test that needs no tool (the pod runner's own) goes first
    files = [("argocd.py", argocd), ("images.py", IMAGES_RANK), ("e2e.py", core), ("kueue.py", kueue)]
    files += [("podrunner.py", -1), ("topology.py", core)]
    expected = ["podrunner.py", "e2e.py", "topology.py", "kueue.py", "argocd.py", "images.py"]
    assert build_order(files) == expected
