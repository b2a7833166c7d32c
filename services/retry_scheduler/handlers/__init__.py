"""The retry scheduler's sub-topologies, one module each; :mod:`services.retry_scheduler.app`
composes them."""
