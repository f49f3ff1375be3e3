"""Recovery without restarting: live membership in etcd, in-process re-forming of the process group, and
state handed from a peer to a joiner (issue 11). ``python -m llm_trainer.live --help`` runs the driver."""
