"""Client certificates for the kubelet tier, signed by the cluster's CA (kwokctl's ``pki/ca.{crt,key}``).

A kubelet node gets ``CN=system:node:<name>, O=system:nodes``: the identity the API server's Node authorizer
and NodeRestriction admission expect, so a node can only change itself and its own pods, as on a real
cluster (no TLS bootstrap: the certificate is issued here, once, with ``openssl``).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from llm_testbed.localcluster.errors import LocalClusterError

DAYS = 30


class PkiError(LocalClusterError):
    """openssl could not issue a certificate; the message carries its output."""


@dataclass(frozen=True)
class ClientCert:
    cert: Path
    key: Path


def cluster_ca(cluster_dir: Path) -> ClientCert:
    """kwokctl's CA of the cluster (certificate and key)."""
    pki = cluster_dir / "pki"
    ca = ClientCert(pki / "ca.crt", pki / "ca.key")
    if not (ca.cert.is_file() and ca.key.is_file()):
        raise PkiError(f"the cluster's CA is missing: expected {ca.cert} and {ca.key} (written by kwokctl)")
    return ca


def subject(common_name: str, organization: str = "") -> str:
    """An openssl ``-subj`` value (pure)."""
    return f"/O={organization}/CN={common_name}" if organization else f"/CN={common_name}"


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise PkiError(f"openssl {args[0]} failed: {result.stderr.strip()}")


def issue(ca: ClientCert, out_dir: Path, name: str, common_name: str, organization: str = "") -> ClientCert:
    """A client certificate ``out_dir/<name>.crt`` (key ``.key``) signed by ``ca``; kept if it exists."""
    out = ClientCert(out_dir / f"{name}.crt", out_dir / f"{name}.key")
    if out.cert.is_file() and out.key.is_file():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    csr = out_dir / f"{name}.csr"
    _openssl("genrsa", "-out", str(out.key), "2048")
    _openssl(
        "req", "-new", "-key", str(out.key), "-subj", subject(common_name, organization), "-out", str(csr)
    )
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key), "-CAcreateserial",
        "-CAserial", str(out_dir / "ca.srl"), "-days", str(DAYS), "-out", str(out.cert),
    )  # fmt: skip
    csr.unlink(missing_ok=True)
    return out
