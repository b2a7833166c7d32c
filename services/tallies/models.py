"""HTTP models of the tallies service: the accounts tally (the default projection's row).
The page of GET /tallies is built from the projection's row model (:mod:`services.tallies.routes`)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class TallyOut(BaseModel):
    program_id: str
    numberActive: int = Field(description="Accounts of the program whose status is active")
    numberInactive: int = Field(description="Accounts of the program that are deactivated")
    lastLogin: int | None = Field(description="Largest login ts (epoch ms) seen for the program; null before any")
