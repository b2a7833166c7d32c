"""The image build's pure parts: local base names follow their inputs, the build command."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tools import image_build
from tools.image_build import LOCAL_BASES, LocalBase, build_command, dockerfile_default


def test_a_local_base_is_named_after_its_inputs(tmp_path: Path) -> None:
    python = LOCAL_BASES[0]
    assert re.fullmatch(r"localhost/statefleet-base-python:bookworm-[0-9a-f]{12}", python.tag([]))
    assert python.tag([]) == python.tag([])
    ca = tmp_path / "proxy.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\nA\n")
    with_ca = python.tag([ca])
    assert with_ca != python.tag([])
    ca.write_text("-----BEGIN CERTIFICATE-----\nB\n")
    assert python.tag([ca]) != with_ca, "a changed certificate rebuilds the base"
    more = LocalBase(python.name, python.build_arg, (*python.packages, "curl"), python.env, python.cmd)
    assert more.tag([]) != python.tag([]), "a changed package list rebuilds the base"


def test_local_bases_stand_in_for_the_dockerfiles_base_arguments() -> None:
    assert [b.build_arg for b in LOCAL_BASES] == ["PYTHON_IMAGE", "MAVEN_IMAGE"]
    assert dockerfile_default("PYTHON_IMAGE").startswith("python:3.11.")
    assert dockerfile_default("MAVEN_IMAGE").endswith("-17")
    python, maven = LOCAL_BASES
    assert {"python3", "python3-venv", "python-is-python3"} <= set(python.packages)
    assert {"openjdk-17-jdk-headless", "maven"} <= set(maven.packages)
    with pytest.raises(SystemExit, match="NOPE"):
        dockerfile_default("NOPE")


def test_build_command_passes_bases_and_the_maven_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATEFLEET_IMAGE_STORAGE_DRIVER", "vfs")
    monkeypatch.delenv("STATEFLEET_IMAGE_STORAGE_ROOT", raising=False)
    cmd = build_command(
        "statefleet:0.1.0", {"PYTHON_IMAGE": "localhost/py:1", "MAVEN_IMAGE": "localhost/mvn:1"}, Path("/root/.m2")
    )
    assert cmd[:7] == [
        "buildah",
        "--storage-driver",
        "vfs",
        "--root",
        image_build.DEFAULT_STORAGE_ROOT,
        "--runroot",
        "/run/containers/statefleet",
    ]
    assert "--layers" in cmd and cmd[cmd.index("--format") + 1] == "docker"
    assert cmd[cmd.index("--tag") + 1] == "statefleet:0.1.0"
    assert "MAVEN_IMAGE=localhost/mvn:1" in cmd and "PYTHON_IMAGE=localhost/py:1" in cmd
    assert cmd[cmd.index("--volume") + 1] == "/root/.m2:/root/.m2:rw"
    assert cmd[-1] == str(image_build.REPO)
    assert "--iidfile" not in cmd
    with_id = build_command("statefleet:0.1.0", {}, None, Path("/x/image-id"))
    assert with_id[with_id.index("--iidfile") + 1] == "/x/image-id"
    public = build_command("statefleet:0.1.0", {}, None)
    assert "--build-arg" not in public and "--volume" not in public


def test_extra_certificates_come_from_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "b.crt").write_text("b")
    (tmp_path / "a.crt").write_text("a")
    (tmp_path / "notes.txt").write_text("not a certificate")
    monkeypatch.setenv("STATEFLEET_IMAGE_CA_DIR", str(tmp_path))
    assert image_build.ca_files() == [tmp_path / "a.crt", tmp_path / "b.crt"]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STATEFLEET_IMAGE_CA_DIR", "")
    assert image_build.ca_files() == []
    monkeypatch.setenv("STATEFLEET_IMAGE_CA_DIR", str(tmp_path / "missing"))
    assert image_build.ca_files() == []


def context(tmp_path: Path, dockerignore: str) -> Path:
    """A repository with a Dockerfile, some sources, their bytecode, and files outside the context."""
    (tmp_path / "Dockerfile").write_text("FROM ${PYTHON_IMAGE}\nCOPY . .\n")
    (tmp_path / ".dockerignore").write_text(dockerignore)
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    (tmp_path / "services" / "__pycache__").mkdir(parents=True)
    (tmp_path / "services" / "app.py").write_text("print('x')\n")
    (tmp_path / "services" / "__pycache__" / "app.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "services" / "stray.pyc").write_bytes(b"\0")
    (tmp_path / ".local").mkdir()
    (tmp_path / ".local" / "image-id").write_text("sha256:1")
    (tmp_path / "notes.md").write_text("not in the image")
    return tmp_path


DOCKERIGNORE = "# only what the image needs\n*\n!pyproject.toml\n!services/\n!missing/\n**/__pycache__\n**/*.pyc\n"


def test_the_context_is_what_dockerignore_lets_in(tmp_path: Path) -> None:
    repo = context(tmp_path, DOCKERIGNORE)
    files = image_build.context_files(repo)
    assert files is not None
    assert [f.relative_to(repo).as_posix() for f in files] == ["pyproject.toml", "services/app.py"]
    # The repository's own .dockerignore has that form.
    assert image_build.context_files() is not None


@pytest.mark.parametrize(
    "dockerignore",
    [
        "services/tests\n",  # not "everything, then let back in"
        "*\n!services/\n**/__pycache__\n!services/__pycache__/keep.pyc\n",  # let in after a leave-out
        "*\n!serv*\n",  # a pattern let in
        "*\n!services/\nservices/*.md\n",  # a leave-out with a folder
    ],
)
def test_a_dockerignore_of_another_form_is_not_followed(tmp_path: Path, dockerignore: str) -> None:
    assert image_build.context_files(context(tmp_path, dockerignore)) is None
    assert image_build.inputs_digest({}, tmp_path) is None


def test_the_inputs_digest_follows_sources_modes_arguments_and_bases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = context(tmp_path, DOCKERIGNORE)
    base_ids = {"localhost/py:1": "p1", dockerfile_default("MAVEN_IMAGE"): "m1"}
    monkeypatch.setattr(image_build, "image_id", base_ids.get)
    args = {"PYTHON_IMAGE": "localhost/py:1"}
    first = image_build.inputs_digest(args, repo)
    assert first is not None and image_build.inputs_digest(args, repo) == first
    (repo / "services" / "__pycache__" / "app.cpython-311.pyc").write_bytes(b"\1")
    (repo / "notes.md").write_text("changed, but not in the image")
    assert image_build.inputs_digest(args, repo) == first
    changes: list[Callable[[], object]] = [
        lambda: (repo / "services" / "app.py").write_text("print('y')\n"),
        lambda: (repo / "services" / "app.py").chmod(0o755),
        lambda: (repo / "services" / "new.py").write_text(""),
        lambda: (repo / "Dockerfile").write_text("FROM ${PYTHON_IMAGE}\nCOPY . /app\n"),
        lambda: args.update(PYTHON_IMAGE="localhost/py:2") or base_ids.update({"localhost/py:2": "p1"}),
        lambda: base_ids.update({"localhost/py:2": "p2"}),  # the same name, another image
    ]
    seen = {first}
    for change in changes:
        change()
        digest = image_build.inputs_digest(args, repo)
        assert digest is not None and digest not in seen
        seen.add(digest)
    base_ids.pop("localhost/py:2")
    assert image_build.inputs_digest(args, repo) is None, "a base not in the store: nothing to compare"


def test_an_image_built_from_the_same_inputs_is_tagged_not_built_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATEFLEET_IMAGE_STORAGE_ROOT", str(tmp_path / "store"))
    monkeypatch.setattr(image_build, "choose_bases", lambda mode, timeout: {})
    monkeypatch.setattr(image_build, "inputs_digest", lambda build_args: "inputs-1")
    in_store = {"abc"}
    monkeypatch.setattr(image_build, "image_id", lambda ref: ref if ref in in_store else None)
    monkeypatch.setattr(image_build, "image_size", lambda ref: "1 GB")
    calls: list[list[str]] = []
    monkeypatch.setattr(image_build, "buildah", lambda *args, **kwargs: calls.append(list(args)))

    def run(command: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(command[:1] + command[command.index("build") : command.index("build") + 1])
        Path(command[command.index("--iidfile") + 1]).write_text("sha256:abc")
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", run)
    iidfile = tmp_path / "image-id"
    build = ["--tag", "statefleet:0.1.0", "--iidfile", str(iidfile)]
    image_build.build(image_build.parse_args(build))
    assert calls == [["buildah", "build"]] and image_build.built_images() == {"inputs-1": "abc"}
    calls.clear()
    iidfile.unlink()
    image_build.build(image_build.parse_args(build))
    assert calls == [["tag", "abc", "statefleet:0.1.0"]] and iidfile.read_text() == "sha256:abc"
    calls.clear()
    in_store.clear()  # removed from the store since: built again
    image_build.build(image_build.parse_args(build))
    assert calls == [["buildah", "build"]]
