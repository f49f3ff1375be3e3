"""Each tier's first test waits for the Go tools it needs before its timeout starts, and the integration
tier runs its files in the order those tools are built.

``make test`` builds the tools in the background, one group after another in ``tools.GROUPS`` order, then
the images (docs/development.md, "CI time"). A test's timeout must not pay for that wait, so this hook, outer
to pytest-timeout's, waits first: the trainer tier for etcd, the chart tier for the control plane and helm,
an integration test for the control plane, helm and the groups its file names with
``pytest.mark.tools("kueue", ...)``. The wait is per tool group (``tools.ensure``). A failed build is left to
the test's own fixture, which fails with its reason.

On a cold machine the integration tier must not stand behind the last group: its files run in the order
their last tool is built (files marked ``images`` after every group, since the images build last), so most
of the tier runs while Kueue, Karpenter, the kubelet tier's tools, Argo CD and the images still build. A file
stays whole (its module fixtures start once); files that need the same tools keep their collection order.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterable, Sequence

import pytest
from llm_testbed.localcluster import tools
from llm_testbed.localcluster.cluster import CLUSTER_TOOLS

CONTROL_PLANE = ("etcd", "kubernetes", "kwok", "helm")
"""The tool groups every integration cluster test needs (the control plane, and helm for the chart)."""
IMAGES_RANK = len(tools.GROUPS)
"""Where a file marked ``images`` runs: after every Go group (the images build after the tools)."""


def groups_for(nodeid: str, markers: set[str], named: Iterable[str] = ()) -> tuple[str, ...]:
    """The tool groups an integration cluster test waits for, in build order (pure: from its path, markers
    and its ``tools`` marks' names); ``()`` for every other test."""
    if "cluster" not in markers or not nodeid.startswith("tests/integration/"):
        if named:  # it would be ignored: the test would start before its tools and time out instead
            raise ValueError(f"{nodeid}: pytest.mark.tools needs an integration test marked cluster")
        return ()
    wanted = {*CONTROL_PLANE, *named}
    unknown = wanted - {g.name for g in tools.GROUPS}
    if unknown:
        raise ValueError(f"{nodeid}: pytest.mark.tools names unknown tool groups {sorted(unknown)}")
    return tuple(g.name for g in tools.GROUPS if g.name in wanted)


def tools_for(nodeid: str, markers: set[str], named: Iterable[str] = ()) -> tuple[str, ...]:
    """The commands a test waits for (what ``tools.ensure`` takes)."""
    if groups := set(groups_for(nodeid, markers, named)):
        return tuple(t for g in tools.GROUPS if g.name in groups for t in g.commands)
    if "cluster" in markers:
        return (*CLUSTER_TOOLS, "helm")
    if "trainer" in markers:
        return ("etcd",)
    return ()


def ready_rank(groups: Sequence[str], images: bool) -> int:
    """When a test can start on a cold machine: the build position of its last group (images after all)."""
    if images:
        return IMAGES_RANK
    positions = {g.name: i for i, g in enumerate(tools.GROUPS)}
    return max((positions[g] for g in groups), default=-1)


def build_order(files: Sequence[tuple[str, int]]) -> list[str]:
    """Integration files ``(path, rank)`` in collection order -> the order to run them: by rank, each file
    keeping its place among the files of the same rank (a stable sort)."""
    return [path for path, _ in sorted(files, key=lambda f: f[1])]


def _marks(item: pytest.Item) -> tuple[set[str], list[str]]:
    named = [str(name) for mark in item.iter_markers("tools") for name in mark.args]
    return {m.name for m in item.iter_markers()}, named


class ToolsFirst:
    """A pytest plugin: ``config.pluginmanager.register(ToolsFirst())``."""

    def __init__(self) -> None:
        self.ready: set[str] = set()

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        slots = [i for i, item in enumerate(items) if item.nodeid.startswith("tests/integration/")]
        ranks: dict[str, int] = {}
        for i in slots:
            markers, named = _marks(items[i])
            rank = ready_rank(groups_for(items[i].nodeid, markers, named), "images" in markers)
            path = items[i].nodeid.split("::", 1)[0]
            ranks[path] = max(ranks.get(path, rank), rank)
        order = {path: n for n, path in enumerate(build_order(list(ranks.items())))}
        moved = sorted((items[i] for i in slots), key=lambda it: order[it.nodeid.split("::", 1)[0]])
        for i, item in zip(slots, moved, strict=True):
            items[i] = item

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, None, None]:
        markers, named = _marks(item)
        wanted = [t for t in tools_for(item.nodeid, markers, named) if t not in self.ready]
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
