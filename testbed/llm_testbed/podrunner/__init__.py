"""The local pod runner: pods bound to the local cluster's fake nodes run as real local processes.

kwok keeps playing the kubelet of the nodes (status, Lease); in a cluster started with ``run_pods`` it
has no pod Stages, and this runner acts for the pods instead: it starts each container's command from
the pod spec in a private mount and UTS namespace with its own loopback IP, reports the real state,
and honours deletion, grace periods and node loss. Modules, one job each:

- :mod:`.expand`  kubelet's ``$(VAR)`` expansion (pure)
- :mod:`.plan`    pod spec -> what to launch: argv, env, mounts, hostname (pure)
- :mod:`.initcontainers` init containers and native sidecars: the kubelet's rules (pure)
- :mod:`.projected` configMap/secret/downwardAPI/projected volumes -> files (pure);
  :mod:`.apivolumes` fetches the objects and ServiceAccount tokens and writes them
- :mod:`.network` pod IP pool and per-pod hosts files (pure)
- :mod:`.status`  pod status documents (pure)
- :mod:`.launch`  the in-namespace launcher every container starts through
- :mod:`.process` starting, signalling and killing one container's process tree
- :mod:`.probes`  readiness probes (named ports resolved); :mod:`.serviceenv` the env pods get
- :mod:`.apiservice` ``kubernetes.default.svc:443`` forwarded to the API server
- container mode (``--containers``): :mod:`.incontainer` a pod container as ``podman run`` argv and
  :mod:`.security` its security context (pure); :mod:`.containers` podman look-ups, volume ownership and
  removal; :mod:`.containermode` what the runner asks of it
- :mod:`.runner`  the watch loop; :mod:`.daemon` starts/stops it for ``llmjob cluster up/down``
"""
