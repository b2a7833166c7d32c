"""What develops and measures statefleet: the local broker and fleet, the Kubernetes cluster
build, image builds, benchmarks, chaos and demos. None of it runs in production, and none of it
is in the image (.dockerignore); the product never imports it (docs/architecture.md#product-and-tooling)."""
