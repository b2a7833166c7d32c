"""HTTP models of the tallies service."""

from __future__ import annotations

from pydantic import BaseModel, Field


class TallyOut(BaseModel):
    program_id: str
    numberActive: int = Field(description="Accounts of the program whose status is active")
    numberInactive: int = Field(description="Accounts of the program that are deactivated")
    lastLogin: int | None = Field(description="Largest login ts (epoch ms) seen for the program; null before any")


class TallyPage(BaseModel):
    items: list[TallyOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= to get the next page; null on the last page")
