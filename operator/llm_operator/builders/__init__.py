"""Pure desired-state builders: a job (and settings) in, Kubernetes objects (dicts) out. No I/O."""
