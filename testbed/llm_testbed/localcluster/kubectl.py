"""A small typed front of the kubectl we build: argv lists in, parsed JSON or a clear error out."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_testbed.localcluster import apireader, tools
from llm_testbed.localcluster.errors import LocalClusterError

DEFAULT_TIMEOUT_S = 60.0


class KubectlError(LocalClusterError):
    """kubectl exited non-zero; ``stderr`` holds what it said."""

    def __init__(self, argv: list[str], returncode: int, stderr: str) -> None:
        self.argv = argv
        self.returncode = returncode
        self.stderr = stderr.strip()
        last = self.stderr.splitlines()[-1] if self.stderr else "(no output)"
        super().__init__(f"kubectl {' '.join(argv[1:])} failed (exit {returncode}): {last}")

    @property
    def not_found(self) -> bool:
        return "NotFound" in self.stderr or "not found" in self.stderr

    @property
    def conflict(self) -> bool:
        return "Conflict" in self.stderr or "the object has been modified" in self.stderr

    @property
    def replaced(self) -> bool:
        """A write conditioned on ``metadata.uid`` met another object of the same name (the apiserver
        answers that the uid is immutable)."""
        return "metadata.uid" in self.stderr and "immutable" in self.stderr


@dataclass(frozen=True)
class Kubectl:
    """kubectl bound to one kubeconfig (``None``: whatever ``$KUBECONFIG`` says when it runs)."""

    binary: Path
    kubeconfig: Path | None = None

    @classmethod
    def from_env(cls) -> Kubectl:
        """Our built kubectl against ``$KUBECONFIG`` (what ``llmjob cluster up`` told you to export)."""
        kubeconfig = os.environ.get("KUBECONFIG")
        if not kubeconfig:
            raise LocalClusterError(
                "KUBECONFIG is not set: run `llmjob cluster up` and export the path it prints"
            )
        return cls(tools.ensure(["kubectl"])["kubectl"], Path(kubeconfig))

    def argv(self, *args: str) -> list[str]:
        base = [str(self.binary)]
        if self.kubeconfig is not None:
            base.append(f"--kubeconfig={self.kubeconfig}")
        return [*base, *args]

    def run(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl; with ``check`` a non-zero exit raises :class:`KubectlError`."""
        argv = self.argv(*args)
        try:
            result = subprocess.run(
                argv, input=input, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise LocalClusterError(f"kubectl {' '.join(args)} did not finish within {timeout:.0f}s") from exc
        except FileNotFoundError as exc:
            raise LocalClusterError(
                f"kubectl binary {self.binary} does not exist: run `llmjob tools build`"
            ) from exc
        if check and result.returncode != 0:
            raise KubectlError(argv, result.returncode, result.stderr)
        return result

    def json(self, *args: str, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
        """``kubectl <args> -o json``, parsed."""
        return json.loads(self.run(*args, "-o", "json", timeout=timeout).stdout)

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """One object, or ``None`` when it does not exist (read from the API, not by a kubectl process)."""
        return apireader.reader_for(self.kubeconfig).get(kind, name, namespace)

    def items(
        self,
        kind: str,
        namespace: str | None = None,
        *,
        labels: str | None = None,
        fields: str | None = None,
        all_namespaces: bool = False,
    ) -> list[dict[str, Any]]:
        """``kubectl get <kind>`` as a list, read from the API (:meth:`ApiReader.items`)."""
        return apireader.reader_for(self.kubeconfig).items(
            kind, namespace, labels=labels, fields=fields, all_namespaces=all_namespaces
        )

    def apply(self, objects: Iterable[Mapping[str, Any]], *, server_side: bool = True) -> None:
        """Apply objects given as dicts (server-side, field manager ``llmjob``)."""
        doc = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
        flags = ["--server-side", "--field-manager=llmjob", "--force-conflicts"] if server_side else []
        self.run("apply", *flags, "-f", "-", input=json.dumps(doc))

    def create(self, obj: Mapping[str, Any]) -> bool:
        """Create one object; ``False`` when it already exists (nothing is changed then)."""
        result = self.run("create", "-f", "-", input=json.dumps(obj), check=False)
        if result.returncode == 0:
            return True
        if "AlreadyExists" in result.stderr or "already exists" in result.stderr:
            return False
        raise KubectlError(self.argv("create", "-f", "-"), result.returncode, result.stderr)

    def patch(
        self,
        kind: str,
        name: str,
        patch: Mapping[str, Any],
        *,
        namespace: str | None = None,
        patch_type: str = "merge",
        subresource: str | None = None,
    ) -> None:
        ns = ["--namespace", namespace] if namespace else []
        sub = [f"--subresource={subresource}"] if subresource else []
        self.run("patch", kind, name, *ns, *sub, f"--type={patch_type}", "-p", json.dumps(patch))
