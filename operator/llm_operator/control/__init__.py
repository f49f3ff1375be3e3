"""The per-job controller's parts: one module per concern, wired by ``controller``.

- ``jobs``: the run's ``RunningJobs`` (kept in kopf's memo): each job's controller, node health, ghosts,
  and which jobs an event wakes; the handlers start and wake controllers through it.
- ``controller``: ``JobController``, the wake/coalesce loop and one pass, in the order below.
- ``prober``: the job's progress prober beside its loop; what it saw is an input of ``plan()``.
- ``scrape``: (used by ``prober``) the bounded HTTP probes of workers' metrics endpoints, parsed into
  samples, and the per-job tracker of what they said.
- ``ghosts``: a pass first audits its slice of the pod index for pods gone during a watch gap.
- ``expectations``: then overlays what this controller did and its watch has not shown yet.
- ``kueue_sync``: then makes sure of the job's Workload and reads Kueue's verdict (before ``plan()``);
  after the status write, releases or requeues the admission.
- ``apply``: after ``plan()``, the pod changes (marking, live eviction, deletions, creations); after
  the status write, the Events and job metrics.
- ``node_marking``: (used by ``apply``) unhealthy nodes counted and, opt-in, labelled and tainted.
- ``live_evict``: (used by ``apply``) a lost worker's members removed from the job's live membership.
- ``status_writer``: the one writer of a job's status, between the pod changes and the Events.
"""
