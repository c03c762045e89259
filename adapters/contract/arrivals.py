"""How the requests of a served load point arrive, typed: one model per shape, told apart by `kind`.

`constant` and `poisson` (the matrix's plain strings `constant` / `poisson` mean the same) and `gamma` space
requests at the cell's request_rate; `ramp` has rates of its own (from start_rate to end_rate over
duration_s); `trace` carries a trace workload's own inter-arrival times, per request. The times these give
are computed in adapters/serving/arrivals.py.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, Union

from pydantic import BeforeValidator, Field, field_serializer, model_validator

from adapters.contract.model import ContractModel


class _Shape(ContractModel):
    @field_serializer("*", when_used="json")
    def _inf_as_text(self, v):
        """burstiness .inf crosses to the worker as "inf" (pydantic's JSON writes null, even with
        ser_json_inf_nan set here, inside a union)"""
        return str(v) if isinstance(v, float) and math.isinf(v) else v


class ConstantArrival(_Shape):
    """Evenly spaced at the cell's request_rate."""

    kind: Literal["constant"] = "constant"


class PoissonArrival(_Shape):
    """A Poisson process at the cell's request_rate (exponential gaps, seeded)."""

    kind: Literal["poisson"] = "poisson"


class GammaArrival(_Shape):
    """Gamma-distributed gaps at the cell's request_rate, as `vllm bench serve --burstiness`: shape
    `burstiness`, mean 1 / rate (coefficient of variation 1 / sqrt(burstiness)); 1 is a Poisson process,
    below 1 burstier, above 1 more even, .inf evenly spaced."""

    kind: Literal["gamma"] = "gamma"
    burstiness: float = Field(gt=0, description="The gamma shape: 1 Poisson, < 1 bursty, > 1 smoother, .inf even")


class RampArrival(_Shape):
    """A rate rising (or falling) linearly from start_rate to end_rate over duration_s, then staying at
    end_rate; the gaps drawn as `gamma`'s with `burstiness` (1: Poisson, .inf: evenly spaced) against the
    rate at each moment. Its rates are its own: the cell's request_rate is not used."""

    kind: Literal["ramp"] = "ramp"
    start_rate: float = Field(ge=0, description="Requests/s at the start")
    end_rate: float = Field(gt=0, description="Requests/s after duration_s")
    duration_s: float = Field(gt=0, description="Seconds the rate takes to go from start_rate to end_rate")
    burstiness: float = Field(1.0, gt=0, description="The gamma shape of the gaps: 1 Poisson, .inf even")

    @model_validator(mode="after")
    def _finite_rates(self) -> "RampArrival":
        for name in ("start_rate", "end_rate", "duration_s"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        return self


class TraceArrival(_Shape):
    """A trace's own schedule (workload kind trace): `gaps_s[i]` is the time between request i - 1 and
    request i of the prepared requests, already scaled; the first request of a run arrives at its start."""

    kind: Literal["trace"] = "trace"
    gaps_s: list[Annotated[float, Field(ge=0)]]


# the shapes whose gaps are set by the cell's request_rate (.inf there: a closed loop)
RATED = ("constant", "poisson", "gamma")


def _named(v):
    """The plain string forms `constant` / `poisson` (what serve.arrival has always taken)."""
    return {"kind": v} if isinstance(v, str) else v


Arrival = Annotated[Union[ConstantArrival, PoissonArrival, GammaArrival, RampArrival, TraceArrival],
                    Field(discriminator="kind"), BeforeValidator(_named)]

# what a matrix's serve.arrival may say (a trace's schedule comes from its workload, never from here)
MatrixArrival = Annotated[Union[ConstantArrival, PoissonArrival, GammaArrival, RampArrival],
                          Field(discriminator="kind"), BeforeValidator(_named)]
