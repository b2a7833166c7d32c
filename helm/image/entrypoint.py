"""Entrypoint of the statefleet image: one image runs every service and job.

    entrypoint.py MODULE [ARGS...]   run ``python -m MODULE ARGS...``, e.g.
                                     services.tallies, services.validator,
                                     services.retry_scheduler, services.console,
                                     spark_jobs.activation_join,
                                     spark_jobs.backfill_tallies, services.topics
    entrypoint.py driver ARGS...     a Spark driver started by Spark on Kubernetes
                                     (the Spark operator): spark-submit in client mode
    entrypoint.py executor           a Spark executor pod started by a driver

Before it runs anything it points STATEFLEET_SPARK_JARS at the Kafka connector
jars baked into the image (unless already set), so no Spark pod downloads
packages. The process is replaced (exec), so signals from the container runtime
reach the service or JVM directly.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import NoReturn

JARS_DIR = Path(os.environ.get("STATEFLEET_IMAGE_JARS_DIR", "/opt/statefleet/jars"))
MODULE_PACKAGES = ("services", "spark_jobs")
EXECUTOR_BACKEND = "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"
USAGE = "usage: entrypoint.py MODULE [ARGS...] | driver ARGS... | executor"


def fail(message: str) -> NoReturn:
    print(f"statefleet entrypoint: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def baked_jars() -> list[str]:
    return sorted(str(p) for p in JARS_DIR.glob("*.jar"))


def spark_home() -> Path:
    """SPARK_HOME, or the installed pyspark package (it ships Spark's jars and bin/)."""
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"])
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        fail("pyspark is not installed in this image")
    return Path(spec.origin).parent


def prepare_environment(env: dict[str, str]) -> None:
    jars = baked_jars()
    if jars and not env.get("STATEFLEET_SPARK_JARS"):
        env["STATEFLEET_SPARK_JARS"] = ",".join(jars)
    env.setdefault("SPARK_USER", "statefleet")
    env.setdefault("PYSPARK_PYTHON", sys.executable)


def require(env: dict[str, str], *names: str) -> list[str]:
    missing = [n for n in names if not env.get(n)]
    if missing:
        fail(f"executor mode needs {', '.join(missing)} (set by the Spark driver)")
    return [env[n] for n in names]


def driver_command(args: list[str], env: dict[str, str]) -> list[str]:
    bind = env.get("SPARK_DRIVER_BIND_ADDRESS", "0.0.0.0")
    submit = str(spark_home() / "bin" / "spark-submit")
    return [submit, "--conf", f"spark.driver.bindAddress={bind}", "--deploy-mode", "client", *args]


def executor_command(env: dict[str, str]) -> list[str]:
    driver_url, executor_id, cores, app_id, pod_ip, memory = require(
        env,
        "SPARK_DRIVER_URL",
        "SPARK_EXECUTOR_ID",
        "SPARK_EXECUTOR_CORES",
        "SPARK_APPLICATION_ID",
        "SPARK_EXECUTOR_POD_IP",
        "SPARK_EXECUTOR_MEMORY",
    )
    home = spark_home()
    classpath = [str(home / "conf"), str(home / "jars" / "*")]
    if baked_jars():
        classpath.append(str(JARS_DIR / "*"))
    if env.get("SPARK_EXTRA_CLASSPATH"):
        classpath.append(env["SPARK_EXTRA_CLASSPATH"])
    java_opts = [env[k] for k in sorted(env) if k.startswith("SPARK_JAVA_OPT_")]
    java = str(Path(env["JAVA_HOME"]) / "bin" / "java") if env.get("JAVA_HOME") else "java"
    command = [
        java,
        *java_opts,
        f"-Xms{memory}",
        f"-Xmx{memory}",
        "-cp",
        ":".join(classpath),
        EXECUTOR_BACKEND,
        "--driver-url",
        driver_url,
        "--executor-id",
        executor_id,
        "--cores",
        cores,
        "--app-id",
        app_id,
        "--hostname",
        pod_ip,
        "--resourceProfileId",
        env.get("SPARK_RESOURCE_PROFILE_ID", "0"),
    ]
    if env.get("SPARK_EXECUTOR_POD_NAME"):
        command += ["--podName", env["SPARK_EXECUTOR_POD_NAME"]]
    return command


def module_command(module: str, args: list[str]) -> list[str]:
    if module.split(".", 1)[0] not in MODULE_PACKAGES or importlib.util.find_spec(module) is None:
        fail(f"unknown module {module!r}: expected one of the packages {', '.join(MODULE_PACKAGES)}. {USAGE}")
    return [sys.executable, "-m", module, *args]


def command_for(argv: list[str], env: dict[str, str]) -> list[str]:
    if not argv or argv[0] in ("-h", "--help"):
        fail(USAGE)
    head, rest = argv[0], argv[1:]
    if head == "driver":
        return driver_command(rest, env)
    if head == "executor":
        return executor_command(env)
    return module_command(head, rest)


def main() -> None:
    env = dict(os.environ)
    prepare_environment(env)
    command = command_for(sys.argv[1:], env)
    sys.stdout.flush()
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    main()
