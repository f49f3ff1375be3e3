"""Which tools a test waits for before its timeout starts (tests/support/tools_first.py)."""

from __future__ import annotations

from support.tools_first import tools_for


def test_each_tier_waits_for_its_own_tools_and_the_optional_tiers_only_for_their_tests() -> None:
    e2e = tools_for("tests/integration/test_e2e_live.py::t", {"cluster", "trainer"})
    kubelet = tools_for("tests/integration/test_kubelet_tier.py::t", {"cluster"})
    argocd = tools_for("tests/integration/test_argocd.py::t", {"cluster"})
    assert "karpenter" in e2e and "kubelet" not in e2e and not any("argocd" in t for t in e2e)
    assert "kubelet" in kubelet and not any("argocd" in t for t in kubelet)
    assert any("argocd" in t for t in argocd) and "kubelet" not in argocd
    assert tools_for("tests/chart/test_x.py::t", {"cluster"})[-1] == "helm"
    assert tools_for("tests/trainer/test_x.py::t", {"trainer"}) == ("etcd",)
    assert tools_for("tests/unit/test_x.py::t", set()) == ()
