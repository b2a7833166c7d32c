"""The image build's pure parts: local base names follow their inputs, the build command."""

from __future__ import annotations

import re
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
