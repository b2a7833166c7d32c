"""The command validator: the write side of the account domain.

Every change to an account arrives as a command on ``account-commands``; the
validator checks it against the account's current state and either appends an
event to ``account-events`` (it is that topic's only writer) or publishes a
rejection with a reason to ``account-rejections``.
"""

SERVICE = "validator"
DEFAULT_PORT = 8001
