"""The operator console: one web page over the services' public HTTP APIs.

It holds no state of its own: every page is read from the services (any instance
answers), and changing actions are passed on with the operator's admin token.
"""

SERVICE = "console"
DEFAULT_PORT = 8000
