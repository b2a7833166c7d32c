# The container image (Dockerfile), built and run for real without a container daemon:
# buildah builds it, podman runs it (Debian: apt-get install buildah podman runc mmdebstrap;
# .ci/run installs them). See docs/kubernetes.md#the-image.
#
#   make image         build $(IMAGE) from the Dockerfile. The base images are the Dockerfile's
#                      public ones when they can be pulled; otherwise local stand-ins built once
#                      from Debian packages (IMAGE_BASES=public|local forces either)
#   make image-check   build it, then run it as the Helm chart does against the broker: the
#                      topic Job, every service and the console, the Spark join --available-now

# Must equal the chart's default image (values.yaml image.repository, Chart.yaml appVersion);
# tests/helm/test_image.py checks it.
IMAGE ?= statefleet:0.1.0
IMAGE_BASES ?= auto
# The ID of the image this clone built last: the check runs it, whatever another clone's
# build has since tagged $(IMAGE) on the same machine.
IMAGE_ID_FILE := $(CURDIR)/.local/image-id

.PHONY: image
image: venv ## Build the image with buildah (IMAGE=name:tag, IMAGE_BASES=auto|public|local)
	$(PY) -m tools.image_build --tag $(IMAGE) --bases $(IMAGE_BASES) --iidfile $(IMAGE_ID_FILE)

.PHONY: image-check
image-check: image broker ## Build the image and run it like the chart: topic Job, services, console, Spark join (podman)
	@command -v podman >/dev/null || { echo "image-check runs the image with podman: apt-get install podman runc"; exit 1; }
	@start=$$(date +%s); \
	STATEFLEET_IMAGE=$$(cat $(IMAGE_ID_FILE)) $(VENV)/bin/pytest -q -p no:cacheprovider --timeout 900 tests/image \
	&& echo "image-check: passed in $$(( $$(date +%s) - start ))s (build not included)"

# A cold machine's image build (local bases from Debian packages, then every step: about
# 5 min) starts with `make test`, at the lowest priority, and overlaps the suites; `make
# image` waits for it, then finds every layer cached.
.PHONY: image-prebuild
image-prebuild: ## Start building the image in the background (lowest CPU and I/O priority)
	@$(PYTHON) -m tools.image_build --background --tag $(IMAGE) --bases $(IMAGE_BASES) --iidfile $(IMAGE_ID_FILE)

test-early:: image-prebuild

test-extra:: image-check
