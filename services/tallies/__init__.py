"""Running tallies of a projection (by default per program: numberActive, numberInactive, lastLogin)."""

SERVICE = "tallies"
DEFAULT_PORT = 8002
