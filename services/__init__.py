"""The statefleet services; each folder is one independently deployed service."""
