"""The instance types Karpenter's kwok provider may launch (its ``INSTANCE_TYPES_FILE_PATH``), pure.

Modelled on the EKS nodes the static fake nodes imitate (:mod:`llm_testbed.localcluster.nodes`: one
place for their shapes): ``p5.48xlarge`` (8 ``nvidia.com/gpu``, 32 ``vpc.amazonaws.com/efa``, 192 CPU,
2Ti) offered in the GPU zone only (EFA stays in one AZ), and ``m5.2xlarge`` in both CPU zones; each
offered on-demand and spot. Prices are illustrative hourly figures (spot below on-demand, so a pool that
allows both launches spot, as Karpenter does on AWS).

The file's format is the kwok provider's: a list of ``{name, architecture, operatingSystems,
resources, offerings}``, each offering ``{Price, Available, Requirements}`` with node selector
requirements on ``topology.kubernetes.io/zone`` and ``karpenter.sh/capacity-type``.
"""

from __future__ import annotations

from typing import Any

from llm_testbed.localcluster import nodes

CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
ZONE_LABEL = "topology.kubernetes.io/zone"
CAPACITY_TYPES = ("on-demand", "spot")
# Hourly prices (USD), by instance type and capacity type.
PRICES: dict[str, dict[str, float]] = {
    nodes.P5_48XLARGE.instance_type: {"on-demand": 55.04, "spot": 26.11},
    nodes.M5_2XLARGE.instance_type: {"on-demand": 0.384, "spot": 0.154},
}
ZONES: dict[str, tuple[str, ...]] = {
    nodes.P5_48XLARGE.instance_type: (nodes.GPU_ZONE,),
    nodes.M5_2XLARGE.instance_type: nodes.CPU_ZONES,
}


def _requirement(key: str, value: str) -> dict[str, Any]:
    return {"key": key, "operator": "In", "values": [value]}


def offerings(instance_type: str) -> list[dict[str, Any]]:
    """Every (zone, capacity type) in which ``instance_type`` can be launched, with its price."""
    return [
        {
            "Price": PRICES[instance_type][capacity],
            "Available": True,
            "Requirements": [_requirement(CAPACITY_TYPE_LABEL, capacity), _requirement(ZONE_LABEL, zone)],
        }
        for zone in ZONES[instance_type]
        for capacity in CAPACITY_TYPES
    ]


def instance_type(shape: nodes.NodeShape) -> dict[str, Any]:
    return {
        "name": shape.instance_type,
        "architecture": "amd64",
        "operatingSystems": ["linux"],
        "resources": shape.resources(),
        "offerings": offerings(shape.instance_type),
    }


def instance_types() -> list[dict[str, Any]]:
    """The whole catalog, one entry per node kind of the test bed."""
    return [instance_type(shape) for shape in nodes.SHAPES.values()]
