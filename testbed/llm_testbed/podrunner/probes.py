"""Readiness probes as a kubelet runs them, against a pod's IP (``tcpSocket`` and ``httpGet``)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any


def numbered(probe: Mapping[str, Any], container: Mapping[str, Any]) -> dict[str, Any]:
    """``probe`` with a named port (``port: health``) replaced by the container's port of that name;
    a name the container does not declare stays, and the probe fails, as a kubelet's would."""
    out = dict(probe)
    ports = {p.get("name"): p.get("containerPort") for p in container.get("ports") or [] if p.get("name")}
    for kind in ("tcpSocket", "httpGet"):
        action = out.get(kind)
        if isinstance(action, Mapping) and isinstance(action.get("port"), str) and action["port"] in ports:
            out[kind] = {**action, "port": ports[action["port"]]}
    return out


async def probe_once(ip: str, probe: Mapping[str, Any]) -> bool:
    try:
        if "tcpSocket" in probe:
            port = int(probe["tcpSocket"]["port"])
            _, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), timeout=1.0)
            writer.close()
            return True
        get = probe["httpGet"]
        port = int(get["port"])
        reader, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), timeout=1.0)
        writer.write(f"GET {get.get('path', '/')} HTTP/1.0\r\nHost: {ip}\r\n\r\n".encode())
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout=1.0)
        writer.close()
        parts = line.split()
        return len(parts) >= 2 and parts[1][:1] in (b"2", b"3")
    except (TimeoutError, OSError, ValueError, KeyError):
        return False
