"""Label, annotation and taint keys that the fake nodes and the fault injection rely on.

The kwok Stages in ``data/kwok-stages.yaml`` and kwokctl's config (:mod:`kwokconfig`) match on the same
keys: change them together.
"""

from __future__ import annotations

from typing import Final

# Node label: its kubelet is dead. No node Stage matches a node with it, the pod runner stops its pods;
# chaos.node_not_ready also takes the node's Lease from kwok (kwok then leaves the node and its pods alone)
# and reports the node Ready=Unknown and its pods not ready at once.
NODE_NOT_READY_LABEL: Final = "elasticllm.dev/fake-not-ready"
# Pod label: the pod's node is dead (chaos.node_not_ready puts it on every pod there, node_ready takes it
# off). No pod Stage matches a pod with it: kwok may not yet know that it lost the node's Lease, and must
# not report such a pod ready again or finish its deletion meanwhile.
POD_ON_DEAD_NODE_LABEL: Final = "elasticllm.dev/fake-node-lost"
# Pod annotation: the integer exit code the pod's main containers terminate with (0 -> Succeeded).
POD_EXIT_CODE_ANNOTATION: Final = "elasticllm.dev/fake-exit-code"
# Node label that tells the fake GPU nodes from the fake CPU nodes.
NODE_ROLE_LABEL: Final = "elasticllm.dev/fake-node-role"

# What EKS GPU nodes carry (the NVIDIA device plugin's resource and the EKS GPU AMI's taint).
GPU_RESOURCE: Final = "nvidia.com/gpu"
EFA_RESOURCE: Final = "vpc.amazonaws.com/efa"
GPU_TAINT_KEY: Final = "nvidia.com/gpu"

# Taints that announce a node is about to go away.
KARPENTER_DISRUPTED_TAINT: Final = "karpenter.sh/disrupted"  # Karpenter v1, effect NoSchedule
SPOT_INTERRUPTION_TAINT: Final = "aws-node-termination-handler/spot-itn"  # AWS NTH, effect NoSchedule
UNSCHEDULABLE_TAINT: Final = "node.kubernetes.io/unschedulable"  # what a cordon leads to

# Node annotations the local pod runner turns into real faults for the pods it starts on that node
# (``llmjob chaos fault``; ``podrunner/faults.py``). Each one makes one health check fail for real.
NODE_FAULT_READONLY: Final = "elasticllm.dev/fault-readonly-volumes"  # "true": PVC volumes mounted read-only
NODE_FAULT_CPU: Final = "elasticllm.dev/fault-cpu"  # CPU cores a container gets, e.g. "0.2" (cgroup quota)
NODE_FAULT_SHM: Final = "elasticllm.dev/fault-shm-size"  # /dev/shm is a tmpfs of this size, e.g. "1Mi"
NODE_FAULTS: Final = {"readonly-volumes": NODE_FAULT_READONLY, "cpu": NODE_FAULT_CPU, "shm": NODE_FAULT_SHM}
