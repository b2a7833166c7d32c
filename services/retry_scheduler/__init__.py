"""The retry scheduler: redelivers dead letters after a backoff, parks those that used up their attempts."""

SERVICE = "retry_scheduler"
DEFAULT_PORT = 8003
