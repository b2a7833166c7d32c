"""HTTP plumbing shared by the services: the base FastAPI app, errors, health and
metrics, bearer auth, and forwarding queries to the instance that owns a key."""
