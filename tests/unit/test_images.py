"""The image builder (llm_testbed.images): context selection, content keys, the local build arguments,
the commands it runs and its errors. Builds and runs nothing (tests/integration/test_images.py does)."""

from __future__ import annotations

import re
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from llm_testbed import host_packages
from llm_testbed.images import base, build, cli, dockerignore, host, podman, recipe, space, steps, wheelhouse
from llm_testbed.images.errors import ImageError

from tests.unit.test_dockerfiles import Dockerfile, parse

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LLMJOB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LLMJOB_DEBUG", raising=False)


# -- .dockerignore: moby's rules ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lines", "path", "left_out"),
    [
        (["*"], "README.md", True),
        (["*", "!README.md"], "README.md", False),
        (["*", "!operator/"], "operator/llm_operator/cli.py", False),  # a folder rule reaches its files
        (["*", "!operator/", "**/__pycache__"], "operator/x/__pycache__/a.pyc", True),
        (["*", "!operator/", "**/*.pyc"], "operator/a.pyc", True),
        (["*", "!operator/", "**/*.pyc"], "operator/a.py", False),
        (["*.md"], "docs/a.md", False),  # `*` stays within one segment
        (["**/*.md"], "docs/a.md", True),
        (["**/*.md"], "a.md", True),  # `**/` also matches no folder at all
        (["docs/**"], "docs/x/y.md", True),
        (["/docs"], "docs/a.md", True),  # a leading slash is the context root
        (["*", "!images/trainer/constraints.txt"], "images/trainer/Dockerfile", True),
        (["# a comment", "", "a?c"], "abc", True),
        (["!a", "*"], "a", True),  # the last matching rule decides
    ],
)
def test_ignore_rules_match_as_docker_reads_them(lines: list[str], path: str, left_out: bool) -> None:
    assert dockerignore.excluded(dockerignore.parse(lines), path) is left_out


def test_a_lone_negation_is_an_error() -> None:
    with pytest.raises(ValueError, match="names no path"):
        dockerignore.parse(["*", "!"])


def test_context_files_walk_only_what_the_rules_can_reach(tmp_path: Path) -> None:
    for rel in ("pyproject.toml", "pkg/a.py", "pkg/__pycache__/a.pyc", "docs/x.md", ".git/HEAD", "pkg/b.pyc"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    ignore = tmp_path / "ignore"
    ignore.write_text("*\n!pyproject.toml\n!pkg/\n**/__pycache__\n**/*.pyc\n")
    assert dockerignore.context_files(tmp_path, ignore) == ["pkg/a.py", "pyproject.toml"]


@pytest.mark.parametrize("image", sorted(recipe.RECIPES))
def test_real_contexts_hold_the_project_and_nothing_else(image: str) -> None:
    chosen = recipe.RECIPES[image]
    files = dockerignore.context_files(ROOT, ROOT / chosen.ignore_file)
    tops = {f.split("/")[0] for f in files}
    assert {"pyproject.toml", "README.md", "operator", "trainer", "runtime"} <= tops
    assert tops <= {"pyproject.toml", "README.md", "operator", "trainer", "runtime", "images"}
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc") or ".egg-info" in f]
    assert "images/wheelhouse/README.md" in files, "the bind mount's source exists in every context"
    if image == "trainer":
        assert "images/trainer/constraints.txt" in files


# -- the local build's arguments select the Dockerfiles' stages -----------------------------------------


def _stage_of(df: Dockerfile, base_text: str, args: dict[str, str]) -> str:
    """The FROM text after ARG expansion (global defaults, overridden by ``args``)."""
    values = {**df.global_args, **args}
    return re.sub(r"\$\{(\w+)\}", lambda m: values.get(m.group(1), "").strip('"'), base_text)


def built_stages(df: Dockerfile, args: dict[str, str]) -> tuple[set[str], set[str]]:
    """Stages a builder that skips unused stages builds for the last one, and the external images it pulls."""
    by_name = {s.name: s for s in df.stages if s.name}
    stages: set[str] = set()
    images: set[str] = set()
    todo = [df.final]
    while todo:
        stage = todo.pop()
        stages.add(stage.name or "final")
        wanted = [_stage_of(df, stage.base, args)]
        for _, text in stage.instructions:
            wanted += re.findall(r"(?:--|,)from=([\w.-]+)", text)
        for name in wanted:
            if name in by_name:
                if name not in stages:
                    todo.append(by_name[name])
            else:
                images.add(name)
    return stages, images


@pytest.mark.parametrize("image", sorted(recipe.RECIPES))
def test_local_build_arguments_are_declared_and_pull_only_the_base(image: str) -> None:
    chosen = recipe.RECIPES[image]
    df = parse(ROOT / chosen.dockerfile)
    args = recipe.local_build_args(chosen, "localhost/elastic-llm-operator/base:k", "0.0.0")
    assert set(args) <= set(df.global_args), f"undeclared build arguments: {set(args) - set(df.global_args)}"
    assert df.global_args["WHEELHOUSE"] in ('""', ""), "the default build uses the package index"
    _, images = built_stages(df, args)
    assert images == {"localhost/elastic-llm-operator/base:k"}


def test_the_trainer_default_is_the_production_stack_and_the_local_build_says_what_it_leaves_out() -> None:
    df = parse(ROOT / recipe.TRAINER.dockerfile)
    production, pulled = built_stages(df, {})
    assert {"efa", "ofi-build", "system", "wheel", "final"} <= production
    assert any(p.startswith("nvidia/cuda:") for p in pulled)
    local, _ = built_stages(df, recipe.local_build_args(recipe.TRAINER, "b", "0.0.0"))
    left_out = production - local
    assert left_out == {"efa", "ofi-build", "system"}
    assert all(name in recipe.TRAINER.left_out for name in left_out)


def test_every_pip_step_of_both_dockerfiles_can_read_the_wheelhouse() -> None:
    for chosen in recipe.RECIPES.values():
        df = parse(ROOT / chosen.dockerfile)
        for stage in df.stages:
            for run in stage.text("RUN"):
                if re.search(r"pip (wheel|install)", run) and "--no-index --no-deps" not in run:
                    assert "source=images/wheelhouse,target=/wheelhouse" in run, run
                    assert "PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheelhouse" in run, run


# -- content keys -----------------------------------------------------------------------------------------


def _copy_project(target: Path) -> Path:
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for rel in ("operator", "trainer", "runtime", "images"):
        shutil.copytree(ROOT / rel, target / rel, ignore=skip)
    for rel in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / rel, target / rel)
    (target / "docs").mkdir()
    (target / "docs" / "x.md").write_text("docs")
    return target


def test_image_key_covers_what_goes_into_the_image_and_nothing_else(tmp_path: Path) -> None:
    root = _copy_project(tmp_path / "repo")
    key = build.plan(root, recipe.TRAINER).key
    assert build.plan(root, recipe.TRAINER).key == key, "deterministic"

    def changed(rel: str, text: str) -> str:
        path = root / rel
        old = path.read_bytes()
        path.write_text(text)
        try:
            return build.plan(root, recipe.TRAINER).key
        finally:
            path.write_bytes(old)

    assert changed("docs/x.md", "other docs") == key
    assert changed("images/operator/Dockerfile", "FROM scratch\n") == key
    assert changed("trainer/llm_trainer/__init__.py", "# changed\n") != key
    assert changed("images/trainer/Dockerfile", "FROM scratch\n") != key
    assert changed("images/trainer/constraints.txt", "torch==9\n") != key
    (root / "images" / "wheelhouse" / "big.whl").write_text("a user's own wheels are not hashed")
    assert build.plan(root, recipe.TRAINER).key == key
    other_base = replace(recipe.BASE, packages=(*recipe.BASE.packages, "vim"))
    assert build.plan(root, recipe.TRAINER, other_base).key != key
    assert build.plan(root, recipe.OPERATOR).key != key


def test_references_carry_the_key() -> None:
    image = build.plan(ROOT, recipe.OPERATOR)
    assert image.reference == f"localhost/elastic-llm-operator/operator:{image.key}"
    assert re.fullmatch(r"[0-9a-f]{16}", image.key)
    assert base.reference(recipe.BASE).startswith("localhost/elastic-llm-operator/base:")


def test_content_key_is_not_fooled_by_concatenation() -> None:
    from llm_testbed.images.keys import content_key

    assert content_key([("a", b"bc")]) != content_key([("ab", b"c")])
    assert content_key([("a", b"b"), ("c", b"")]) != content_key([("a", b"bc")])


# -- the commands ---------------------------------------------------------------------------------------


def test_podman_keeps_its_storage_under_the_cache_root_and_uses_runc(tmp_path: Path) -> None:
    cmd = podman.Podman("/usr/bin/podman", podman.images_root()).argv("images")
    assert cmd[0] == "/usr/bin/podman" and cmd[-1] == "images"
    flags = dict(zip(cmd[1:-1:2], cmd[2:-1:2], strict=True))
    assert flags["--root"] == str(tmp_path / "cache" / "images" / "storage")
    assert flags["--runroot"] == str(podman.runroot_of(tmp_path / "cache" / "images"))
    assert flags["--runtime"] == "runc"
    assert flags["--cgroup-manager"] == "cgroupfs"
    assert flags["--events-backend"] == "file"


def test_a_runroot_too_long_for_podman_moves_under_tmp_one_folder_per_root() -> None:
    short = Path("/root/.cache/elastic-llm-operator/images")
    assert podman.runroot_of(short) == short / "run"
    long = Path("/tmp/cold/home/.cache/elastic-llm-operator/images")  # + "/run": 51 characters, refused
    moved = podman.runroot_of(long)
    assert moved.parent == Path("/tmp") and len(str(moved)) <= podman.RUNROOT_MAX
    assert podman.runroot_of(long) == moved and podman.runroot_of(long / "other") != moved


def test_ulimits_stay_within_the_hard_limits() -> None:
    import resource

    assert podman.ulimit_flags({"nofile": 20000, "nproc": resource.RLIM_INFINITY}) == [
        "--ulimit",
        "nofile=20000:20000",
        "--ulimit",
        "nproc=-1:-1",
    ]
    limits = podman.container_limits()
    assert limits["nofile"] == resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    assert limits["nproc"] <= pid_max, "podman lowers its own process limit to kernel.pid_max"
    assert limits["nproc"] in (pid_max, resource.getrlimit(resource.RLIMIT_NPROC)[1])


def test_build_runs_offline_from_the_staged_context(tmp_path: Path) -> None:
    image = build.plan(ROOT, recipe.TRAINER)
    cmd = build.build_argv(podman.Podman("podman", tmp_path), image, tmp_path / "ctx")
    text = " ".join(cmd)
    assert "--network=none" in text and "--pull=never" in text and "--format=docker" in text
    assert "--layers=false" in text, "podman 4.3's layer cache ignores what RUN --mount binds"
    assert f"--tag {image.reference}" in text
    assert f"--build-arg TRAINER_SYSTEM={base.reference(recipe.BASE)}" in text
    assert "--build-arg WHEELHOUSE=1" in text
    assert cmd[-1] == str(tmp_path / "ctx")


def test_mmdebstrap_makes_a_minbase_with_what_the_dockerfiles_call(tmp_path: Path) -> None:
    cmd = base.mmdebstrap_argv(recipe.BASE, tmp_path / "b.tar")
    assert cmd[0] == "mmdebstrap" and cmd[-2:] == ["bookworm", str(tmp_path / "b.tar")]
    assert "--variant=minbase" in cmd
    included = next(c for c in cmd if c.startswith("--include=")).removeprefix("--include=").split(",")
    assert {"python3", "python3-pip", "python3-venv", "passwd", "libhwloc15"} <= set(included)


def test_wheelhouse_requirements_follow_pyproject_and_the_dockerfile() -> None:
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    operator_reqs = wheelhouse.requirements(pyproject, recipe.OPERATOR)
    trainer_reqs = wheelhouse.requirements(pyproject, recipe.TRAINER)
    assert not [r for r in operator_reqs if r.startswith("torch")], "torch stays out of the operator image"
    assert any(r.startswith("kopf") for r in operator_reqs)
    for reqs in (operator_reqs, trainer_reqs):
        assert any(r.startswith("setuptools") for r in reqs), "pip wheel . builds offline"
        assert any(r.startswith("pydantic") for r in reqs)
    assert {"torch", "nvidia-nccl-cu13"} <= set(trainer_reqs)


def test_wheelhouse_is_downloaded_for_the_base_python_with_the_pins(tmp_path: Path) -> None:
    cmd = wheelhouse.download_argv("/py", ["torch"], tmp_path / "c.txt", recipe.BASE, tmp_path / "d")
    text = " ".join(cmd)
    assert cmd[:4] == ["/py", "-m", "pip", "download"]
    assert "--only-binary=:all:" in cmd and f"--python-version {recipe.BASE.python}" in text
    assert f"--constraint {tmp_path / 'c.txt'}" in text and cmd[-1] == "torch"
    tags = wheelhouse.platform_tags(recipe.BASE)
    arch = recipe.BASE.arch
    assert tags[0] == f"manylinux_2_36_{arch}" and f"manylinux_2_17_{arch}" in tags
    assert f"manylinux2014_{arch}" in tags


def test_wheelhouse_key_changes_with_the_pins() -> None:
    wanted = ["torch"]
    key = wheelhouse.wheelhouse_key(wanted, b"torch==1", recipe.BASE)
    assert wheelhouse.wheelhouse_key(wanted, b"torch==2", recipe.BASE) != key
    assert wheelhouse.wheelhouse_key(wanted, b"torch==1", replace(recipe.BASE, python="3.12")) != key


# -- host packages and errors ---------------------------------------------------------------------------


def test_missing_host_commands_map_to_debian_packages() -> None:
    assert host.missing_packages(lambda _: None) == ["mmdebstrap", "podman", "runc"]
    assert host.missing_packages(lambda c: None if c == "runc" else "/bin/" + c) == ["runc"]
    assert host.install_argv(["runc"])[-1] == ["apt-get", "install", "-y", "runc"]


def test_installing_needs_root_and_apt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        host_packages.shutil, "which", lambda c: "/usr/bin/apt-get" if c == "apt-get" else None
    )
    monkeypatch.setattr(host_packages.os, "geteuid", lambda: 1000)
    with pytest.raises(ImageError, match=r"run `sudo apt-get install mmdebstrap podman runc`"):
        host.ensure_commands()
    monkeypatch.setattr(host_packages.shutil, "which", lambda c: None)
    with pytest.raises(ImageError, match="no apt-get here"):
        host.ensure_commands()


def test_a_failed_step_names_itself_its_log_and_the_tail(tmp_path: Path) -> None:
    log = tmp_path / "step.log"
    script = "print('STEP 1/2: FROM x'); print('STEP 2/2: RUN y'); print('boom'); raise SystemExit(3)"
    with pytest.raises(ImageError) as failure:
        steps.run_step("trainer image", [sys.executable, "-c", script], log, progress=build._podman_step)
    message = str(failure.value)
    assert message.startswith("trainer image failed (exit 3)")
    assert "at STEP 2/2: RUN y" in message and "boom" in message and str(log) in message
    assert "boom" in log.read_text()


def test_a_build_that_ran_out_of_disk_says_where_and_what_to_do(tmp_path: Path) -> None:
    log = tmp_path / "step.log"
    script = (
        "print('STEP 16/16: CMD x'); print('write /opt/venv/x: no space left on device'); raise SystemExit(1)"
    )
    with pytest.raises(ImageError) as failure:
        try:
            steps.run_step("trainer image", [sys.executable, "-c", script], log, progress=build._podman_step)
        except ImageError as exc:
            raise space.explain(exc) from None
    message = str(failure.value)
    assert "no space left on device" in message and str(podman.images_root()) in message
    assert "GiB free now" in message and "LLMJOB_CACHE_DIR" in message
    other = ImageError("trainer image failed (exit 1): a missing package")
    assert space.explain(other) is other


def test_a_build_wants_room_for_its_wheels_several_times_over(tmp_path: Path) -> None:
    wheel = tmp_path / "torch.whl"
    wheel.write_bytes(b"x" * 1000)
    assert space.wanted([wheel]) == space.ROOM_PER_WHEEL_BYTE * 1000 + space.ROOM_SPARE


def test_a_step_reports_progress_and_its_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    took = steps.run_step(
        "base", [sys.executable, "-c", "print('I: extracting')"], tmp_path / "l", progress=lambda x: x[3:]
    )
    err = capsys.readouterr().err
    assert took >= 0
    assert "[images] base: started (log: " in err and "[images] base: extracting (" in err
    assert "[images] base: done in " in err


def test_nothing_is_built_when_every_image_is_there(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(build.shutil, "which", lambda _: "/usr/bin/podman")
    monkeypatch.setattr(podman.Podman, "image_exists", lambda self, ref: True)
    monkeypatch.setattr(build, "_build", lambda *a: pytest.fail("must not build"))
    refs = build.ensure()
    assert set(refs) == {"operator", "trainer"}
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("[images] up to date, nothing to build: ")


def test_cli_errors_are_one_line_without_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail(names: object) -> dict[str, str]:
        raise ImageError("base: mmdebstrap failed (exit 1)")

    monkeypatch.setattr(build, "ensure", fail)
    assert cli.main(["build"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == "llmjob images build: error: base: mmdebstrap failed (exit 1)"
    with pytest.raises(SystemExit) as usage:
        cli.main(["build", "nope"])
    assert usage.value.code == 2
    assert "no image 'nope'" in capsys.readouterr().err


def test_cli_prints_name_and_reference(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(build, "ensure", lambda names: {n: f"localhost/x/{n}:k" for n in names})
    assert cli.main(["build", "operator"]) == 0
    assert capsys.readouterr().out == "operator localhost/x/operator:k\n"


def test_a_python_without_pip_is_named() -> None:
    with pytest.raises(ImageError, match="/bin/false has no pip"):
        wheelhouse._check_pip("/bin/false")
