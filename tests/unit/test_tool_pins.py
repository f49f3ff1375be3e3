"""One version of each shared Go module across the tool groups (llm_testbed.localcluster.pins)."""

from __future__ import annotations

import pytest
from llm_testbed.localcluster import pins, tools

GO_MOD = """module elasticllm.dev/tools/x

go 1.26.0

require k8s.io/kubernetes v1.36.3

require (
\tgithub.com/a/b v1.2.0 // indirect
\tk8s.io/apimachinery v0.0.0 // indirect
)

replace (
\tk8s.io/apimachinery => k8s.io/apimachinery v0.36.3
\tgithub.com/local => ./local
)

replace github.com/c/d v1.0.0 => github.com/c/d v1.1.0 // a comment
"""


def test_go_mod_versions_with_replace_lines_winning_and_local_folders_left_out() -> None:
    parsed = pins.parse_go_mod(GO_MOD)
    assert dict(parsed.versions) == {
        "k8s.io/kubernetes": "v1.36.3",
        "github.com/a/b": "v1.2.0",
        "k8s.io/apimachinery": "v0.36.3",
        "github.com/c/d": "v1.1.0",
    }
    assert parsed.replaced == {"k8s.io/apimachinery", "github.com/c/d"}
    assert parsed.family == "v0.36"


@pytest.mark.parametrize(
    ("low", "high"),
    [
        ("v1.2.3", "v1.10.0"),
        ("v0.0.0-20250102033503-faa5f7b0171c", "v0.0.0-20260317180543-43fb72c5454a"),
        ("v1.6.1-0.20241114170450-2d3c2a9cc518", "v1.6.1"),  # a pseudo-version before its release
        ("v1.36.11", "v1.36.12-0.20260120151049-f2248ac996af"),
        ("v2.0.0-rc.2", "v2.0.0-rc.10"),
        ("v17.3.0+incompatible", "v20.10.0+incompatible"),
    ],
)
def test_versions_order_as_go_orders_them(low: str, high: str) -> None:
    assert pins.version_key(low) < pins.version_key(high)


def test_shared_modules_rise_to_the_highest_and_kubernetes_libraries_only_within_a_minor() -> None:
    def group(versions: dict[str, str]) -> pins.Pins:
        return pins.Pins(versions, frozenset())

    groups = {
        "kubernetes": group({"k8s.io/apimachinery": "v0.36.3", "google.golang.org/grpc": "v1.79.3"}),
        "kwok": group({"k8s.io/apimachinery": "v0.36.1", "google.golang.org/grpc": "v1.81.1"}),
        "kueue": group({"k8s.io/apimachinery": "v0.35.3", "google.golang.org/grpc": "v1.79.3"}),
        "etcd": group({"google.golang.org/grpc": "v1.83.2", "go.etcd.io/bbolt": "v1.4.3"}),
    }
    assert pins.aligned(groups) == {
        "kubernetes": {"google.golang.org/grpc": "v1.83.2"},
        "kwok": {"k8s.io/apimachinery": "v0.36.3", "google.golang.org/grpc": "v1.83.2"},
        "kueue": {"google.golang.org/grpc": "v1.83.2"},  # Kueue's Kubernetes v0.35 stays
    }


def test_the_committed_tool_modules_share_one_version_of_each_module() -> None:
    fix = "run: PYTHONPATH=testbed python -m llm_testbed.localcluster.pins"
    assert pins.aligned(pins.committed_pins()) == {}, fix
    assert {g.toolchain for g in tools.GROUPS} == {tools.GO_TOOLCHAIN}  # one compiler, or nothing is shared
