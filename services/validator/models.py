"""HTTP models of the validator service."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from services.validator.domain import MAX_ID_LENGTH, REASONS
from shared.http.bounds import MAX_JSON_DEPTH, JsonObject, NonNegativeInt64, Text, check_json

CommandType = Literal["CreateAccount", "UpdateAccount", "DeactivateAccount", "ReactivateAccount", "DeleteAccount"]


def _no_nul(value: str | None) -> str | None:
    if value is not None and "\x00" in value:
        raise ValueError("must not contain NUL")
    return value


class CommandIn(BaseModel):
    """A command as POST /commands takes it. Types are checked strictly (no coercion of
    "3" to 3) and unknown fields are refused, so a misspelt ``expected_version`` cannot
    silently turn off the version check."""

    model_config = ConfigDict(strict=True, extra="forbid")

    command_id: Text | None = Field(
        None,
        min_length=1,
        max_length=MAX_ID_LENGTH,
        description="Idempotency key; generated (UUID4) when absent. Sending the same id again yields the same outcome.",
    )
    type: CommandType
    account_id: Text = Field(min_length=1, max_length=MAX_ID_LENGTH)
    program_id: Text | None = Field(None, min_length=1, max_length=MAX_ID_LENGTH, description="Required by CreateAccount")
    expected_version: NonNegativeInt64 | None = Field(
        None, description="When given, the command is rejected with VERSION_CONFLICT unless it equals the current version"
    )
    data: JsonObject = Field(
        default_factory=dict,
        description="CreateAccount: initial data; UpdateAccount: merged in. Integers must fit in 64 bits (signed), "
        f"numbers be finite, nesting at most {MAX_JSON_DEPTH} levels deep",
    )
    issued_at: NonNegativeInt64 | None = Field(None, description="Epoch ms; defaults to the time the API received the command")

    _ids_without_nul = field_validator("command_id", "account_id", "program_id")(_no_nul)


class CommandAccepted(BaseModel):
    command_id: str


class EventOut(BaseModel):
    event_id: str = Field(description="Derived from (account_id, command_id): a replayed event has the same id")
    command_id: str
    type: str
    account_id: str
    program_id: str
    version: int
    occurred_at: int
    data: dict[str, Any]


class RejectionOut(BaseModel):
    command_id: str
    account_id: str
    reason: str = Field(description=" | ".join(REASONS))
    detail: str
    current_version: int | None


class CommandStatus(BaseModel):
    command_id: str
    status: Literal["pending", "accepted", "rejected"]
    account_id: str
    event: EventOut | None = Field(None, description="The event, when accepted")
    rejection: RejectionOut | None = Field(None, description="The rejection, when rejected")
    reason: str | None = Field(None, description="The rejection reason, when rejected")
    detail: str | None = Field(None, description="The rejection detail, when rejected")


class AccountOut(BaseModel):
    account_id: str
    program_id: str
    status: Literal["active", "inactive", "deleted"]
    version: int


class ProgramAccount(BaseModel):
    account_id: str
    program_id: str
    status: str = Field(description="active | inactive | deleted")
    version: int
    created_at: int = Field(description="occurred_at of AccountCreated (epoch ms)")
    updated_at: int = Field(description="occurred_at of the account's latest event (epoch ms)")


class ProgramAccountsPage(BaseModel):
    items: list[ProgramAccount]
    next_cursor: str | None = Field(description="Pass as ?cursor= to get the next page; null on the last page")


class CommandBatchIn(BaseModel):
    """A batch as POST /commands/batch takes it. Only the envelope is checked here: each item
    is decided on its own, like a single command, so an item that is not a valid command is
    rejected INVALID_COMMAND (or dead-lettered, when not even a JSON object) by itself."""

    model_config = ConfigDict(strict=True, extra="forbid")

    batch_id: Text = Field(
        min_length=1,
        max_length=MAX_ID_LENGTH,
        description="Names the batch; resending the same batch decides only the items not yet decided",
    )
    commands: list[Annotated[Any, AfterValidator(check_json)]] = Field(
        min_length=1,
        description="Commands as POST /commands takes them (at most STATEFLEET_BATCH_MAX_COMMANDS); an item "
        "without command_id gets '<batch_id>:<index>'",
    )

    _ids_without_nul = field_validator("batch_id")(_no_nul)


class BatchAccepted(BaseModel):
    batch_id: str
    command_ids: list[str] = Field(description="Each item's command id, in the batch's order")


class BatchItemOut(BaseModel):
    index: int
    command_id: str
    status: Literal["pending", "accepted", "rejected"]
    reason: str | None = Field(None, description="The rejection reason, when rejected")
    detail: str | None = Field(None, description="The rejection detail, when rejected")
    version: int | None = Field(None, description="The event's version, when accepted")


class BatchCounts(BaseModel):
    pending: int
    accepted: int
    rejected: int
    rejected_by_reason: dict[str, int] = Field(description=" | ".join(REASONS))


class BatchStatus(BaseModel):
    batch_id: str
    total: int
    counts: BatchCounts
    items: list[BatchItemOut] = Field(description="Items in the batch's order, from the cursor on")
    next_cursor: str | None = Field(description="Pass as ?cursor= to get the next page; null on the last page")
