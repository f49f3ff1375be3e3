"""The kubelet node tier: nodes of a local cluster run by a real kubelet and containerd on this machine.

See docs/development.md, "Real nodes: the kubelet tier (--kubelet)". :class:`tier.KubeletTier` starts and
ends a cluster's nodes and what they share; :mod:`chaos` gives ``llmjob chaos`` its real meaning on them.
"""
