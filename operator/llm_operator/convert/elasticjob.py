"""TorchElastic ElasticJob (elastic.pytorch.org/v1alpha1), the deprecated TorchElastic controller's kind.

Its image's entrypoint is the launcher (``torchelastic.distributed.launch``): the worker container's
args are the launcher's options, then the script and its arguments.
"""

from __future__ import annotations

from typing import Any

from llm_operator.convert import common
from llm_operator.convert.pod import convert_pod
from llm_operator.convert.source import ConvertError, Report

API_VERSION = "elastic.pytorch.org/v1alpha1"
KIND = "ElasticJob"
CONTAINER = "elasticjob-worker"


def convert(doc: dict[str, Any], report: Report) -> dict[str, Any]:
    meta, source = common.open_document(doc, report)
    spec: dict[str, Any] = {}
    for key in ("minReplicas", "maxReplicas"):
        value = source.take_int(key)
        if value is None:
            raise ConvertError([f"{source.at(key)}: required"])
        spec[key] = value
    endpoint = source.take_str("rdzvEndpoint")
    if endpoint:
        spec["rendezvous"] = {"backend": "etcd-v3", "endpoint": endpoint}
        report.warn(
            "spec.rdzvEndpoint",
            "kept as spec.rendezvous.endpoint (etcd v3 API); leave it out to have the operator run the"
            " rendezvous server",
        )
    specs = source.child("replicaSpecs")
    if not specs.has("Worker"):
        raise ConvertError(["spec.replicaSpecs.Worker: required"])
    worker = specs.child("Worker")
    specs.done()
    replicas = worker.take_int("replicas")
    worker.drop("restartPolicy", "the operator replaces failed workers itself (spec.failurePolicy); dropped")
    path = "spec.replicaSpecs.Worker.template"
    template = worker.take("template")
    worker.done()
    run = source.child("RunPolicy") if source.has("RunPolicy") else source.child("runPolicy")
    run.done()
    source.done()
    pod = convert_pod(template, path, CONTAINER, report, entrypoint_launcher=True)
    spec = common.merge(pod, spec)
    if replicas is not None:
        spec["replicas"] = min(max(replicas, spec["minReplicas"]), spec["maxReplicas"])
    common.require_image(spec, f"{path}.spec.containers")
    return common.job(meta, spec)
