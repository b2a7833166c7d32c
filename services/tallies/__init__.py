"""Running tallies per program: numberActive, numberInactive, lastLogin."""

SERVICE = "tallies"
DEFAULT_PORT = 8002
