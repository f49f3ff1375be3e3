"""The cluster's ``kubernetes`` Service as pods see it: ``kubernetes.default.svc:443`` reaches the API server.

In a cluster that name resolves to the Service's ClusterIP and kube-proxy forwards port 443 to the API
server. Clients that build their address from ``KUBERNETES_SERVICE_HOST``/``_PORT`` (client-go, the
official Python client) already reach it here (the runner sets them to the API server itself); clients that
use the name (kopf's ``login_with_service_account``: ``https://kubernetes.default.svc``) need the name and
port 443. So the runner listens on port 443 of a loopback address of its own (the first free one of
127.2.0.0/24: several runners on one machine each get one) and forwards every connection, TLS and all, to the
API server; every pod's hosts file maps the Service's names to that address. The server's certificate names
``kubernetes.default.svc`` (kwok's does), so TLS verification passes as in a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import Callable

SERVICE_NETWORK = ipaddress.IPv4Network("127.2.0.0/24")
PORT = 443
NAMES = ("kubernetes.default.svc.cluster.local", "kubernetes.default.svc", "kubernetes.default")


def hosts_line(ip: str, namespace: str) -> str:
    """The hosts-file line of the Service for a pod in ``namespace`` (``kubernetes`` alone in ``default``)."""
    names = [*NAMES, *(["kubernetes"] if namespace == "default" else [])]
    return f"{ip} {' '.join(names)}"


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(ConnectionError, OSError):
            writer.close()


class ApiService:
    """Forwards ``<ip>:443`` to the API server (``host``:``port``) while the runner runs."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.ip: str | None = None
        self._server: asyncio.Server | None = None

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    async def start(self, say: Callable[[str], None]) -> str | None:
        """Listen on the first free address; its IP, or None (with one line saying why) if none is free."""
        last: OSError | None = None
        for ip in SERVICE_NETWORK.hosts():
            try:
                self._server = await asyncio.start_server(self._forward, str(ip), PORT)
            except OSError as exc:
                last = exc
                continue
            self.ip = str(ip)
            say(f"kubernetes.default.svc:{PORT} -> {self.host}:{self.port} (via {self.ip})")
            return self.ip
        say(f"kubernetes.default.svc is not provided to pods: no address of {SERVICE_NETWORK} could listen "
            f"on port {PORT} ({last})")  # fmt: skip
        return None

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
