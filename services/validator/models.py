"""HTTP models of the validator service."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model, field_validator

from services.validator.domain import ACCOUNT_REASONS, ACCOUNTS
from shared.domain import MAX_ID_LENGTH, Domain
from shared.http.bounds import Text, check_json


def _no_nul(value: str | None) -> str | None:
    if value is not None and "\x00" in value:
        raise ValueError("must not contain NUL")
    return value


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
    reason: str = Field(description=" | ".join(ACCOUNT_REASONS))
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


class DomainCommandStatus(BaseModel):
    """GET /commands/{command_id} of a domain other than accounts; the aggregate id is under
    the domain's field (a subclass per domain adds it)."""

    command_id: str
    status: Literal["pending", "accepted", "rejected"]
    event: dict[str, Any] | None = Field(None, description="The event, when accepted")
    rejection: dict[str, Any] | None = Field(None, description="The rejection, when rejected")
    reason: str | None = Field(None, description="The rejection reason, when rejected")
    detail: str | None = Field(None, description="The rejection detail, when rejected")


def command_status_model(domain: Domain[Any]) -> type[BaseModel]:
    """The GET /commands/{command_id} body of ``domain``."""
    if domain is ACCOUNTS:
        return CommandStatus
    model: type[BaseModel] = create_model(
        "CommandStatus",
        __base__=DomainCommandStatus,
        **{domain.message_id_field: (str, Field(description=f"The {domain.noun} the command is for"))},  # type: ignore[call-overload]
    )
    return model


class AggregateOut(BaseModel):
    aggregate_id: str
    version: int = Field(description="1 after the creating command, one more per accepted command")
    state: dict[str, Any] = Field(description="The domain's state of the aggregate")


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
    rejected_by_reason: dict[str, int] = Field(description="Rejections by reason")


class BatchStatus(BaseModel):
    batch_id: str
    total: int
    counts: BatchCounts
    items: list[BatchItemOut] = Field(description="Items in the batch's order, from the cursor on")
    next_cursor: str | None = Field(description="Pass as ?cursor= to get the next page; null on the last page")
