"""A container's security context as ``podman run`` flags (pure: no I/O).

The pod's ``securityContext`` and the container's are merged as a kubelet merges them (the container's
field wins). What becomes a flag:

- ``runAsUser`` / ``runAsGroup``: ``--user UID[:GID]`` (unset: the image's own user);
- ``fsGroup`` and ``supplementalGroups``: ``--group-add`` (the runner also gives the pod's writable
  volumes to ``fsGroup``, as a kubelet does);
- ``runAsNonRoot``: checked against the user the container would run as, with the kubelet's errors;
- ``readOnlyRootFilesystem``: ``--read-only`` (and no tmpfs of podman's own: only the pod's volumes
  are writable);
- ``capabilities.drop`` / ``add``: ``--cap-drop`` / ``--cap-add`` (``IPC_LOCK`` or ``CAP_IPC_LOCK``);
- ``allowPrivilegeEscalation: false``: ``--security-opt no-new-privileges``;
- ``privileged``: ``--privileged``;
- ``seccompProfile``: ``RuntimeDefault`` is podman's default profile, ``Unconfined`` turns it off.

Anything else a context may hold (SELinux and AppArmor options, ``procMount``, Windows options...) is
refused with the field's name rather than silently dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llm_testbed.podrunner.plan import PlanError

_POD_FIELDS = {"runAsUser", "runAsGroup", "runAsNonRoot", "fsGroup", "supplementalGroups", "seccompProfile",
               "fsGroupChangePolicy", "sysctls"}  # fmt: skip
_CONTAINER_FIELDS = {"runAsUser", "runAsGroup", "runAsNonRoot", "readOnlyRootFilesystem", "capabilities",
                     "allowPrivilegeEscalation", "privileged", "seccompProfile"}  # fmt: skip


@dataclass(frozen=True)
class Security:
    """What the container may do, merged from the pod's and the container's security context."""

    user: int | None = None
    group: int | None = None
    fs_group: int | None = None
    supplemental_groups: tuple[int, ...] = ()
    run_as_non_root: bool = False
    read_only_root: bool = False
    cap_drop: tuple[str, ...] = ()
    cap_add: tuple[str, ...] = ()
    no_new_privileges: bool = False
    privileged: bool = False
    seccomp_unconfined: bool = False


def _id(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PlanError(f"{where}: {value!r} is not a user or group ID (an integer >= 0)")
    return value


def _check_fields(where: str, ctx: Mapping[str, Any], allowed: set[str]) -> None:
    for name, value in ctx.items():
        if name not in allowed and value not in (None, {}, [], False):
            raise PlanError(f"{where}.{name}: not supported by the local pod runner's container mode")


def _seccomp(where: str, ctx: Mapping[str, Any]) -> bool | None:
    """True: unconfined; False: the runtime's default; None: not set here."""
    profile = ctx.get("seccompProfile")
    if not profile:
        return None
    kind = profile.get("type")
    if kind not in ("RuntimeDefault", "Unconfined"):
        raise PlanError(f"{where}.seccompProfile.type: {kind!r}: only RuntimeDefault or Unconfined")
    return bool(kind == "Unconfined")


def _capabilities(where: str, names: Any) -> tuple[str, ...]:
    out = []
    for name in names or []:
        text = str(name).upper()
        if not text.replace("_", "").isalnum():
            raise PlanError(f"{where}: {name!r} is not a capability name (e.g. IPC_LOCK, ALL)")
        out.append(text)
    return tuple(out)


def security_of(pod: Mapping[str, Any], container: Mapping[str, Any]) -> Security:
    """The merged security context of ``container`` in ``pod`` (errors name the field)."""
    name = container.get("name")
    pod_ctx = pod.get("spec", {}).get("securityContext") or {}
    ctx = container.get("securityContext") or {}
    pod_where, where = "spec.securityContext", f"container {name}: securityContext"
    _check_fields(pod_where, pod_ctx, _POD_FIELDS)
    _check_fields(where, ctx, _CONTAINER_FIELDS)
    if pod_ctx.get("sysctls"):
        raise PlanError(f"{pod_where}.sysctls: not supported by the local pod runner's container mode")

    def merged(field: str) -> tuple[str, Any]:
        if ctx.get(field) is not None:
            return f"{where}.{field}", ctx[field]
        return f"{pod_where}.{field}", pod_ctx.get(field)

    user_where, user = merged("runAsUser")
    group_where, group = merged("runAsGroup")
    fs_group = pod_ctx.get("fsGroup")
    unconfined = _seccomp(where, ctx)
    if unconfined is None:
        unconfined = _seccomp(pod_where, pod_ctx)
    caps = ctx.get("capabilities") or {}
    return Security(
        user=None if user is None else _id(user_where, user),
        group=None if group is None else _id(group_where, group),
        fs_group=None if fs_group is None else _id(f"{pod_where}.fsGroup", fs_group),
        supplemental_groups=tuple(
            _id(f"{pod_where}.supplementalGroups", g) for g in pod_ctx.get("supplementalGroups") or []
        ),
        run_as_non_root=bool(merged("runAsNonRoot")[1]),
        read_only_root=bool(ctx.get("readOnlyRootFilesystem")),
        cap_drop=_capabilities(f"{where}.capabilities.drop", caps.get("drop")),
        cap_add=_capabilities(f"{where}.capabilities.add", caps.get("add")),
        no_new_privileges=ctx.get("allowPrivilegeEscalation") is False,
        privileged=bool(ctx.get("privileged")),
        seccomp_unconfined=bool(unconfined),
    )


def image_uid(image_user: str) -> int | None:
    """The numeric UID of an image's ``USER`` (``""``: root), or None for a user name."""
    uid = image_user.split(":", 1)[0] or "0"
    return int(uid) if uid.isdigit() else None


def user_flag(sec: Security, image_user: str, container: str) -> list[str]:
    """``--user`` for the context's user and group (none: the image's user), after the kubelet's
    ``runAsNonRoot`` check against the user the container will really run as."""
    uid = sec.user if sec.user is not None else image_uid(image_user)
    if sec.run_as_non_root:
        if uid is None:
            raise PlanError(f"container {container}: runAsNonRoot: the image's user {image_user!r} is not "
                            "numeric, so it cannot be verified to be non-root")  # fmt: skip
        if uid == 0:
            raise PlanError(f"container {container}: runAsNonRoot: the container would run as root (UID 0)")
    if sec.user is None and sec.group is None:
        return []
    if sec.group is None:
        return ["--user", str(sec.user)]
    if uid is None:
        raise PlanError(f"container {container}: runAsGroup without runAsUser needs an image user given as "
                        f"a number, not {image_user!r}")  # fmt: skip
    return ["--user", f"{uid}:{sec.group}"]


def security_flags(sec: Security, image_user: str, container: str) -> list[str]:
    """Every ``podman run`` flag of the security context."""
    flags = user_flag(sec, image_user, container)
    for group in (*((sec.fs_group,) if sec.fs_group is not None else ()), *sec.supplemental_groups):
        flags += ["--group-add", str(group)]
    if sec.read_only_root:
        flags += ["--read-only", "--read-only-tmpfs=false"]
    for cap in sec.cap_drop:
        flags += ["--cap-drop", cap]
    for cap in sec.cap_add:
        flags += ["--cap-add", cap]
    if sec.no_new_privileges:
        flags += ["--security-opt", "no-new-privileges"]
    if sec.privileged:
        flags += ["--privileged"]
    if sec.seccomp_unconfined:
        flags += ["--security-opt", "seccomp=unconfined"]
    return flags
