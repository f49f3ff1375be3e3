"""Each tier's first test waits for the Go tools it needs before its timeout starts.

``make test`` builds the tools in the background while the unit tier runs (docs/development.md, "CI time").
A test's timeout must not pay for that wait, so this hook, outer to pytest-timeout's, waits first: the
trainer tier for etcd, the chart tier for the control plane and helm, the integration tier for every tool.
The wait is per tool group (``tools.ensure``): the chart tier starts as soon as helm is built, while Kueue
and Karpenter still build. A failed build is left to the test's own fixture, which fails with its reason.
"""

from __future__ import annotations

import time
from collections.abc import Generator

import pytest
from llm_testbed.localcluster import tools
from llm_testbed.localcluster.cluster import CLUSTER_TOOLS

OWN_TESTS_ONLY = {"containerd": "kubelet", "kubenode": "kubelet", "coredns": "kubelet", "argocd": "argocd"}
"""Tool groups that only the tests whose node id holds the word wait for (the kubelet tier's, Argo CD's)."""


def tools_for(nodeid: str, markers: set[str]) -> tuple[str, ...]:
    """The tools a test needs before it starts (pure: from its path and markers)."""
    if "cluster" in markers:
        if not nodeid.startswith("tests/integration/"):
            return (*CLUSTER_TOOLS, "helm")
        return tuple(
            t for g in tools.GROUPS if OWN_TESTS_ONLY.get(g.name, "tests/") in nodeid for t in g.commands
        )
    if "trainer" in markers:
        return ("etcd",)
    return ()


class ToolsFirst:
    """A pytest plugin: ``config.pluginmanager.register(ToolsFirst())``."""

    def __init__(self) -> None:
        self.ready: set[str] = set()

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, None, None]:
        markers = {m.name for m in item.iter_markers()}
        wanted = [t for t in tools_for(item.nodeid, markers) if t not in self.ready]
        if wanted:
            reporter = item.config.pluginmanager.get_plugin("terminalreporter")
            started = time.monotonic()
            try:
                tools.ensure(wanted)
                self.ready.update(wanted)
            except tools.ToolError:
                pass  # the test's fixture calls ensure again and fails with the reason
            waited = time.monotonic() - started
            if reporter is not None and waited >= 1:
                names = ", ".join(wanted)
                reporter.write_line(f"\n[tools] waited {waited:.0f}s for {names} before {item.nodeid}")
        yield
