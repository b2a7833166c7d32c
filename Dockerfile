# syntax=docker/dockerfile:1.7
#
# One image for every statefleet service and Spark job. The container's
# arguments choose what runs (see helm/image/entrypoint.py):
#   docker run IMAGE services.tallies          # or services.validator, services.retry_scheduler, services.console
#   docker run IMAGE spark_jobs.activation_join --available-now
#   docker run IMAGE services.topics           # the chart's topic Job
#
# It holds the product only: what runs in production (the services, the topic Job,
# the Spark jobs). What develops and measures it (tools/: the cluster, image builds,
# benchmarks, chaos; tests/; docs/) stays out of the build context (.dockerignore).
#
# Stages: `jars` resolves the Spark Kafka connector from Maven Central, `build`
# installs the Python packages into a virtualenv (compilers live only here),
# and the final stage holds the virtualenv, the jars, a Java runtime for Spark
# and nothing to build with. It runs as the non-root user 10001.
#
#   docker build -t statefleet:0.1.0 .
#   make image          # the same with buildah, no daemon (docs/kubernetes.md#the-image)
#
# The base images are build arguments, pinned by tag; pin them by digest as well in a
# registry that mirrors them (--build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:...).
# Where the public ones cannot be pulled, `make image` builds stand-ins from Debian
# bookworm packages (Python 3.11; Java 17 and Maven) and passes them here.

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
ARG MAVEN_IMAGE=maven:3.9.11-eclipse-temurin-17
# The pyspark version installed and the connector version baked in move together
# (pyproject.toml pins pyspark to it). The token provider, used only for Kafka
# delegation tokens, has a version of its own (see spark_jobs/kafka-connector.pom.xml).
# DL3064 flags "TOKEN" in its name; it holds a version, nothing secret.
ARG SPARK_VERSION=4.2.0
# hadolint ignore=DL3064
ARG SPARK_KAFKA_TOKEN_PROVIDER_VERSION=4.0.0

# ---------------------------------------------------------------------------
FROM ${MAVEN_IMAGE} AS jars
ARG SPARK_VERSION
# hadolint ignore=DL3064
ARG SPARK_KAFKA_TOKEN_PROVIDER_VERSION
WORKDIR /build
COPY spark_jobs/kafka-connector.pom.xml helm/image/maven-settings.xml ./
RUN mvn -q -B -s maven-settings.xml -f kafka-connector.pom.xml \
        -Dspark.kafka.version="${SPARK_VERSION}" \
        -Dspark.kafka.token.version="${SPARK_KAFKA_TOKEN_PROVIDER_VERSION}" \
        dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=/jars \
    && test -f "/jars/spark-sql-kafka-0-10_2.13-${SPARK_VERSION}.jar" \
    && test -f "/jars/spark-token-provider-kafka-0-10_2.13-${SPARK_KAFKA_TOKEN_PROVIDER_VERSION}.jar" \
    && ls -l /jars

# ---------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS build
ARG SPARK_VERSION
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# A compiler for any dependency that has no wheel for this platform.
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
# The image's virtualenv gets no installer (pip, setuptools: 23 MB nothing runs): pip lives
# in a virtualenv of its own, here only, and installs into the image's one (PIP_PYTHON is
# pip's --python). `python` is the image's, `pip` the installer's.
RUN python -m venv /opt/installer \
    && python -m venv --without-pip /opt/statefleet/venv
ENV PATH=/opt/statefleet/venv/bin:/opt/installer/bin:$PATH \
    PIP_PYTHON=/opt/statefleet/venv/bin/python
WORKDIR /src
# What the image runs and nothing else (no test or lint tools): every package at the
# version and hash requirements-image.lock pins (make lock writes it, at the versions of
# requirements.lock). From the lock alone, so that a change to the code reuses this layer
# (and the final stage's copy of it); the venv's path includes /opt/statefleet/app, where
# the project goes next. pip's cache is a build cache mount: a rebuild after a lock
# change downloads only what changed, and no cache lands in a layer.
COPY requirements-image.lock ./
RUN --mount=type=cache,id=statefleet-pip,target=/root/.cache/pip \
    grep -q "^pyspark==${SPARK_VERSION} " requirements-image.lock \
    && pip install --require-hashes --no-deps -r requirements-image.lock \
    && python -c "import pyspark; assert pyspark.__version__ == '${SPARK_VERSION}', pyspark.__version__" \
    && ! python -c "import pip" 2>/dev/null && ! python -c "import setuptools" 2>/dev/null \
    && python -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], 'statefleet-app.pth').write_text('/opt/statefleet/app\n')"
# .dockerignore lets in only pyproject.toml, requirements-image.lock, README.md (the package's
# description) and the product's packages: services/, shared/, spark_jobs/ and examples/ (the
# orders domain a validator can run, STATEFLEET_VALIDATOR_DOMAIN=examples.orders.domain:ORDERS).
COPY . .
# The project itself, with nothing resolved anew.
RUN --mount=type=cache,id=statefleet-pip,target=/root/.cache/pip \
    pip install --no-deps --target /opt/statefleet/app . \
    && python -c "import services, services.topics.job, shared, spark_jobs, examples.orders.domain, examples.orders.projection, pyspark" \
    && test ! -e /opt/statefleet/app/tools && test ! -e /opt/statefleet/app/tests

# ---------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
ARG SPARK_VERSION
LABEL org.opencontainers.image.title="statefleet" \
      org.opencontainers.image.description="statefleet stream processors (Faust, RocksDB, FastAPI) and Spark jobs" \
      io.statefleet.spark.version="${SPARK_VERSION}"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# A Java runtime for Spark and tini as PID 1; the man directory is missing in
# slim images and the JRE's package scripts expect it.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 statefleet \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/statefleet --create-home \
        --shell /usr/sbin/nologin statefleet \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/statefleet /var/lib/statefleet-spark

COPY --from=build /opt/statefleet/venv /opt/statefleet/venv
COPY --from=build /opt/statefleet/app /opt/statefleet/app
COPY --from=jars /jars /opt/statefleet/jars
COPY helm/image/entrypoint.py /opt/statefleet/bin/entrypoint.py

ENV PATH=/opt/statefleet/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/statefleet \
    STATEFLEET_HTTP_HOST=0.0.0.0 \
    STATEFLEET_DATA_DIR=/var/lib/statefleet

USER 10001:10001
WORKDIR /home/statefleet
EXPOSE 8000 8001 8002 8003
ENTRYPOINT ["/usr/bin/tini", "--", "python", "/opt/statefleet/bin/entrypoint.py"]
CMD ["services.tallies"]
