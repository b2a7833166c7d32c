"""The retry scheduler's HTTP routes, one module per resource; :mod:`services.retry_scheduler.api` joins them."""
