"""One version of each shared Go module across the tool groups, so a cold machine compiles it once.

Each tool group's wrapper module (``deploy/local/tools/<group>/go.mod``) pins an upstream release, and Go's
minimal version selection then picks the versions of everything that release uses. Two groups that end up
with the same module at two versions compile that module's packages twice, and so does every package that
imports them: on the 11 groups of 2026-12-07 that was 407 MB of Go source compiled for 190 MB of distinct
packages (docs/decisions.md, "CI6: one version of each shared module"). The Go build cache reuses a compiled
package only where its source, its dependencies' and the toolchain are the same.

``aligned`` raises each module that two groups share to the highest version either uses:

- a Kubernetes library (``k8s.io/...``, ``sigs.k8s.io/...``) only within the groups that build against the
  same Kubernetes minor (its *family*, from ``k8s.io/apimachinery``): Kueue's v0.35 stays v0.35;
- every other module across all groups.

Run ``python -m llm_testbed.localcluster.pins`` after a version bump (docs/development.md, "Bumping a
version"); ``tests/unit/test_tool_pins.py`` fails while the committed go.mod files are not aligned. It only
ever raises versions (the ``require`` line, or the ``replace`` line where a group replaces the module), then
runs ``go mod tidy``, and repeats until nothing moves, since a raised module can raise others.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llm_testbed.localcluster import tools

_SEMVER = re.compile(r"^v(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$")
KUBE_PREFIXES = ("k8s.io/", "sigs.k8s.io/")
FAMILY_MODULE = "k8s.io/apimachinery"


def version_key(version: str) -> tuple[int, int, int, int, tuple[tuple[int, int | str], ...]]:
    """Semantic-version order (a pre-release, pseudo-versions included, sorts before its release)."""
    match = _SEMVER.match(version)
    if match is None:
        raise ValueError(f"not a semantic version: {version!r}")
    major, minor, patch, pre = match.groups()
    if pre is None:
        return int(major), int(minor), int(patch), 1, ()
    parts = tuple((0, int(p)) if p.isdigit() else (1, p) for p in pre.split("."))
    return int(major), int(minor), int(patch), 0, parts


@dataclass(frozen=True)
class Pins:
    """What one wrapper module builds with: module -> version (a ``replace`` target wins over ``require``)."""

    versions: Mapping[str, str]
    replaced: frozenset[str]

    @property
    def family(self) -> str:
        """The Kubernetes minor the group builds against (``v0.36``), or "" for a group without it."""
        version = self.versions.get(FAMILY_MODULE, "")
        return ".".join(version.split(".")[:2])


_REQUIRE = re.compile(r"^\s*(?:require\s+)?([^\s()]+)\s+(v[^\s]+)(?:\s*//.*)?$")
_REPLACE = re.compile(r"^\s*(?:replace\s+)?([^\s()]+)(?:\s+v[^\s]+)?\s*=>\s*([^\s]+)\s+(v[^\s]+)\s*$")


def parse_go_mod(text: str) -> Pins:
    """The required and replaced versions in a go.mod text (local-folder replacements are left out)."""
    required: dict[str, str] = {}
    replaced: dict[str, str] = {}
    block = ""
    for raw in text.splitlines():
        line = raw.split("//", 1)[0].rstrip() if "=>" in raw else raw.rstrip()
        stripped = line.strip()
        if stripped.endswith("(") and stripped.split()[0] in ("require", "replace", "exclude", "retract"):
            block = stripped.split()[0]
            continue
        if stripped == ")":
            block = ""
            continue
        keyword = stripped.split(" ", 1)[0]
        kind = block or keyword
        if kind == "replace" and (m := _REPLACE.match(line)):
            replaced[m.group(1)] = m.group(3)
        elif kind == "require" and (m := _REQUIRE.match(line)):
            required[m.group(1)] = m.group(2)
    return Pins({**required, **replaced}, frozenset(replaced))


def _scope(module: str, pins: Pins) -> str:
    return pins.family if module.startswith(KUBE_PREFIXES) else "*"


def aligned(groups: Mapping[str, Pins]) -> dict[str, dict[str, str]]:
    """Per group, the modules to raise and the version to raise each to (pure: from the groups' pins)."""
    highest: dict[tuple[str, str], str] = {}
    for pins in groups.values():
        for module, version in pins.versions.items():
            key = (_scope(module, pins), module)
            if key not in highest or version_key(version) > version_key(highest[key]):
                highest[key] = version
    raises: dict[str, dict[str, str]] = {}
    for name, pins in groups.items():
        for module, version in pins.versions.items():
            target = highest[(_scope(module, pins), module)]
            if version_key(target) > version_key(version):
                raises.setdefault(name, {})[module] = target
    return raises


def committed_pins(groups: Iterable[tools.ToolGroup] = tools.GROUPS) -> dict[str, Pins]:
    return {g.name: parse_go_mod((g.module_dir / "go.mod").read_text()) for g in groups}


def _go(group: tools.ToolGroup, *args: str) -> None:
    env = {**tools.go_env(group), "GOFLAGS": "-mod=mod"}
    print(f"[pins] {group.name}: go {' '.join(args)}", flush=True)
    subprocess.run([tools.go_binary(), *args], cwd=group.module_dir, env=env, check=True)


def align(rounds: int = 6) -> int:
    """Raise the committed pins until they are aligned; returns how many modules moved."""
    by_name = {g.name: g for g in tools.GROUPS}
    moved = 0
    for _ in range(rounds):
        pins = committed_pins()
        raises = aligned(pins)
        if not raises:
            return moved
        for name, modules in sorted(raises.items()):
            group = by_name[name]
            edits = [
                f"-replace={m}={m}@{v}" if m in pins[name].replaced else f"-require={m}@{v}"
                for m, v in sorted(modules.items())
            ]
            _go(group, "mod", "edit", *edits)
            _go(group, "mod", "tidy")  # minimal version selection again: what the raised modules need
            moved += len(modules)
    raise RuntimeError(f"the pins did not settle in {rounds} rounds: {aligned(committed_pins())}")


def main() -> int:
    try:
        moved = align()
    except (subprocess.CalledProcessError, RuntimeError) as exc:
        print(f"[pins] failed: {exc}", file=sys.stderr)
        return 1
    print(f"[pins] aligned: {moved} module versions raised", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["Pins", "align", "aligned", "committed_pins", "parse_go_mod", "version_key"]
