"""The image definition: stages, user, versions that must agree, and the entrypoint's dispatch."""

from __future__ import annotations

import importlib.util
import re
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from spark_jobs.config import KAFKA_TOKEN_PROVIDER_VERSION
from tests.helm.chart import CHART, REPO

DOCKERFILE = (REPO / "Dockerfile").read_text()


def stages() -> dict[str, str]:
    parts = re.split(r"^FROM\s+", DOCKERFILE, flags=re.M)[1:]
    named = {}
    for part in parts:
        header = part.splitlines()[0]
        match = re.search(r"\bAS\s+(\S+)", header, flags=re.I)
        named[match.group(1) if match else header] = part
    return named


def setting(pattern: str, text: str) -> str:
    """The first group of ``pattern``'s first match in ``text`` (line by line); there must be one."""
    match = re.search(pattern, text, flags=re.M)
    assert match, f"{pattern!r} matches nothing"
    return match.group(1)


def pom_text(parent: ET.Element, path: str, ns: dict[str, str]) -> str | None:
    """The text of the POM element at ``path`` under ``parent``; there must be one."""
    element = parent.find(path, ns)
    assert element is not None, f"the POM has no {path} under {parent.tag}"
    return element.text


def entrypoint() -> ModuleType:
    path = REPO / "helm" / "image" / "entrypoint.py"
    spec = importlib.util.spec_from_file_location("statefleet_image_entrypoint", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_multi_stage_with_a_pinned_python_base():
    assert list(stages()) == ["jars", "build", "runtime"]
    base = setting(r"^ARG PYTHON_IMAGE=(\S+)", DOCKERFILE)
    assert re.fullmatch(r"python:3\.\d+\.\d+-slim-\w+", base), "the base is pinned to a patch release"


def test_final_stage_is_non_root_without_build_tools():
    final = stages()["runtime"]
    assert re.search(r"^USER 10001:10001$", final, flags=re.M)
    assert "build-essential" not in final and "gcc" not in final
    assert "COPY --from=build /opt/statefleet/venv" in final
    assert "COPY --from=jars /jars /opt/statefleet/jars" in final
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["security"]["runAsUser"] == 10001


def test_one_entrypoint_for_every_service_and_job():
    final = stages()["runtime"]
    assert 'ENTRYPOINT ["/usr/bin/tini", "--", "python", "/opt/statefleet/bin/entrypoint.py"]' in final
    ep = entrypoint()
    python = sys.executable
    for module in ("services.tallies", "services.topics", "spark_jobs.activation_join"):
        assert ep.command_for([module, "--flag"], {}) == [python, "-m", module, "--flag"]
    for module in ("os.path", "tools.kafka_broker"):  # only the product's packages run
        with pytest.raises(SystemExit):
            ep.command_for([module], {})
    with pytest.raises(SystemExit):
        ep.command_for([], {})


def test_entrypoint_spark_on_kubernetes_roles():
    ep = entrypoint()
    driver = ep.command_for(
        ["driver", "--properties-file", "/opt/spark/conf/spark.properties"], {"SPARK_DRIVER_BIND_ADDRESS": "10.0.0.7"}
    )
    assert Path(driver[0]).name == "spark-submit"
    assert driver[1:5] == ["--conf", "spark.driver.bindAddress=10.0.0.7", "--deploy-mode", "client"]
    env = {
        "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@10.0.0.7:7078",
        "SPARK_EXECUTOR_ID": "3",
        "SPARK_EXECUTOR_CORES": "2",
        "SPARK_APPLICATION_ID": "spark-1",
        "SPARK_EXECUTOR_POD_IP": "10.0.0.9",
        "SPARK_EXECUTOR_MEMORY": "2g",
        "SPARK_EXECUTOR_POD_NAME": "join-exec-3",
        "SPARK_JAVA_OPT_0": "-Dx=1",
    }
    cmd = ep.command_for(["executor"], env)
    assert cmd[cmd.index("-cp") + 2] == "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"
    assert cmd[1:4] == ["-Dx=1", "-Xms2g", "-Xmx2g"]
    assert cmd[cmd.index("--executor-id") + 1] == "3" and cmd[cmd.index("--podName") + 1] == "join-exec-3"
    with pytest.raises(SystemExit):
        ep.command_for(["executor"], {})


def test_entrypoint_points_spark_at_the_baked_jars(tmp_path, monkeypatch):
    ep = entrypoint()
    (tmp_path / "b.jar").touch()
    (tmp_path / "a.jar").touch()
    monkeypatch.setattr(ep, "JARS_DIR", tmp_path)
    env: dict[str, str] = {}
    ep.prepare_environment(env)
    assert env["STATEFLEET_SPARK_JARS"] == f"{tmp_path / 'a.jar'},{tmp_path / 'b.jar'}"
    kept = {"STATEFLEET_SPARK_JARS": "/custom.jar"}
    ep.prepare_environment(kept)
    assert kept["STATEFLEET_SPARK_JARS"] == "/custom.jar"


def test_spark_versions_agree_between_project_image_pom_and_chart():
    dockerfile = setting(r"^ARG SPARK_VERSION=(\S+)", DOCKERFILE)
    token = setting(r"^ARG SPARK_KAFKA_TOKEN_PROVIDER_VERSION=(\S+)", DOCKERFILE)
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    pom = ET.parse(REPO / "spark_jobs" / "kafka-connector.pom.xml").getroot()
    chart = yaml.safe_load((CHART / "values.yaml").read_text())["spark"]["join"]["sparkApplication"]["sparkVersion"]
    spark_extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["spark"]
    assert f"pyspark=={dockerfile}" in spark_extra
    assert dockerfile == pom_text(pom, "m:properties/m:spark.kafka.version", ns) == chart
    assert token == pom_text(pom, "m:properties/m:spark.kafka.token.version", ns) == KAFKA_TOKEN_PROVIDER_VERSION
    artifacts = [pom_text(d, "m:artifactId", ns) for d in pom.findall("m:dependencies/m:dependency", ns)]
    assert artifacts == ["spark-sql-kafka-0-10_2.13", "spark-token-provider-kafka-0-10_2.13"]
    jars = stages()["jars"]
    assert "COPY spark_jobs/kafka-connector.pom.xml" in jars
    assert '-Dspark.kafka.version="${SPARK_VERSION}"' in jars
    assert '-Dspark.kafka.token.version="${SPARK_KAFKA_TOKEN_PROVIDER_VERSION}"' in jars
    assert "pyspark==${SPARK_VERSION}" in stages()["build"]


def test_build_context_lets_in_only_what_the_image_needs():
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    assert ignore[ignore.index("*") + 1 :].count("!services/") == 1
    for needed in ("!pyproject.toml", "!services/", "!shared/", "!spark_jobs/", "!examples/", "!helm/image/"):
        assert needed in ignore
    # What develops and measures the product stays out of the image.
    let_in = [line[1:].rstrip("/") for line in ignore if line.startswith("!")]
    assert not {name.split("/")[0] for name in let_in} & {"tools", "tests", "docs", "mk", ".ci"}, let_in
    for source in re.findall(r"^COPY (?!--from)(\S+(?: \S+)*) \S+$", DOCKERFILE, flags=re.M):
        for path in source.split():
            if path != ".":
                assert (REPO / path).exists(), path


def test_the_built_image_is_the_charts_default_image(render):
    """`make image` tags what a default `helm install` pulls, and the image check runs that tag."""
    from tests.image import container
    from tools import image_build

    built = setting(r"^IMAGE \?= (\S+)$", (REPO / "mk" / "image.mk").read_text())
    images = {c["image"] for _, pod in render().pod_specs() for c in pod.get("containers", [])}
    assert images == {built}, f"the chart deploys {images}, make image builds {built}"
    assert image_build.DEFAULT_TAG == container.IMAGE == built
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert built.endswith(f":{project}"), "the image's tag is the project's version"


def test_the_image_installs_its_own_lock():
    """The build stage installs requirements-image.lock (no dev packages), which the context lets in."""
    build = stages()["build"]
    assert "pip install --require-hashes --no-deps -r requirements-image.lock" in build
    assert "-r requirements.lock" not in build
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    assert "!requirements-image.lock" in ignore and "!requirements.lock" not in ignore
