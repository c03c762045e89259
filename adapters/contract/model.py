"""The base of every contract model: unknown fields are errors, on both sides of the worker boundary."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ContractModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
