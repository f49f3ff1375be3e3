"""Take a PyTorch launcher (torchrun and its older names) off a source command.

The operator runs the job's command under its own launcher (``torchrun --no-python`` with the PET_*
contract), so a source that starts torchrun itself would start it twice. The launcher's options are
set by the operator from the job's spec; ``--nproc-per-node`` becomes ``spec.nprocPerNode``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LAUNCHERS: tuple[tuple[str, ...], ...] = (
    ("torchrun",),
    ("python", "-m", "torch.distributed.run"),
    ("python3", "-m", "torch.distributed.run"),
    ("python", "-m", "torch.distributed.launch"),
    ("python3", "-m", "torch.distributed.launch"),
    ("python", "-m", "torchelastic.distributed.launch"),
    ("python3", "-m", "torchelastic.distributed.launch"),
)
# Launcher options without a value; every other option takes one (--opt=value or --opt value).
_FLAGS = {"--standalone", "--no-python", "--no_python", "-m", "--module", "--run-path", "--run_path"}
_NPROC = {"--nproc-per-node", "--nproc_per_node"}
SHELLS = ("sh", "bash", "/bin/sh", "/bin/bash", "/usr/bin/env")


@dataclass
class Program:
    """The user's program argv without a launcher, and what the launcher was told."""

    argv: list[str]
    launcher: str = ""
    """The launcher found ('' when none)."""
    nproc: str | None = None
    """The launcher's --nproc-per-node value, as written."""
    dropped: list[str] = field(default_factory=list)
    """Launcher options the operator sets itself, as written."""


def _launcher(argv: list[str]) -> tuple[str, ...] | None:
    for prefix in LAUNCHERS:
        if tuple(argv[: len(prefix)]) == prefix or (
            len(prefix) == 1 and argv[:1] and argv[0].rsplit("/", 1)[-1] == prefix[0]
        ):
            return prefix
    return None


def split(argv: list[str], assume_launcher: bool = False) -> Program:
    """``argv`` without its launcher; ``assume_launcher``: argv are the launcher's arguments (a
    TorchElastic ElasticJob, whose image's entrypoint is the launcher)."""
    prefix = () if assume_launcher else _launcher(argv)
    if prefix is None:
        return Program(list(argv))
    out = Program([], launcher=" ".join(prefix) or "the image's launcher")
    rest = list(argv[len(prefix) :])
    module = no_python = False
    while rest and rest[0].startswith("-"):
        token = rest.pop(0)
        name, eq, value = token.partition("=")
        if name in _FLAGS:
            module = module or name in ("-m", "--module")
            no_python = no_python or name in ("--no-python", "--no_python")
            if name not in ("-m", "--module", "--no-python", "--no_python"):
                out.dropped.append(token)
            continue
        if not eq and rest:
            value = rest.pop(0)
            token = f"{token} {value}"
        if name in _NPROC:
            out.nproc = value
        else:
            out.dropped.append(token)
    if module:
        out.argv = ["python", "-m", *rest]
    elif no_python:
        out.argv = rest
    else:
        out.argv = ["python", *rest] if rest else []
    return out


def is_shell(argv: list[str]) -> bool:
    """A command that runs a shell string (``bash -c ...``): its launcher cannot be taken off."""
    return bool(argv) and argv[0] in SHELLS and "-c" in argv[1:3]
