"""manifest.json: what was asked (the matrix as given, the cells) and where it ran (host, versions).

`Manifest` is the one reader: the stored matrix comes back as a real `Matrix` where today's models
take it, and where they do not (a run dir written by an earlier version, or by hand) each section a
reader asks for (baseline, tolerances, measure, ...) is read on its own, its defaults where it is
absent, exactly as that section alone would validate. No host names, user names or absolute paths:
results are meant to be shared.
"""

from __future__ import annotations

import functools
from importlib import metadata
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from adapters.contract.host import host_facts
from orchestrator.matrix.cells import Cell
from orchestrator.matrix.models import Matrix, Measure, Sampling, Tolerances
from orchestrator.store.schema import SCHEMA_VERSION

# the driver's own; each engine's come from its adapter's declaration (`packages`)
_DRIVER_PACKAGES = ("lossless-bench", "ray", "pyarrow", "pydantic", "numpy", "torch", "transformers")


class Session(BaseModel):
    """One `bench run` into the run dir: when it started and, once it ended, when."""

    model_config = ConfigDict(extra="allow")

    started: str | None = None
    ended: str | None = None


class Manifest(BaseModel):
    # keys a later version adds survive a rewrite by this one
    model_config = ConfigDict(extra="allow")

    schema_version: int | None = None
    run_id: str | None = None
    matrix_text: str | None = None
    matrix: Matrix | None = Field(None, exclude=True)   # None: the stored matrix is not today's (see sections)
    matrix_json: dict[str, Any] = Field(default_factory=dict, exclude=True)   # the matrix as stored
    cells: list[dict[str, Any]] = Field(default_factory=list)
    host: dict[str, Any] = Field(default_factory=dict)
    driver_versions: dict[str, str] = Field(default_factory=dict)
    sessions: list[Session] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _stored_matrix(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "matrix_json" in data:
            return data
        data = dict(data)
        stored = data.pop("matrix", None)
        if isinstance(stored, Matrix):   # a run's own matrix: no need to validate it again
            return data | {"matrix": stored, "matrix_json": stored.model_dump(mode="json")}
        data["matrix_json"] = stored = stored or {}
        try:
            data["matrix"] = Matrix.model_validate(stored) if stored else None
        except ValidationError:
            data["matrix"] = None
        return data

    def section(self, name: str, model: type[BaseModel] | None = None) -> Any:
        """One section of the matrix: the real Matrix's where there is one, else the stored section
        validated on its own (`model`), or its default where it was not stored."""
        if self.matrix is not None:
            return getattr(self.matrix, name)
        raw = self.matrix_json.get(name)
        field = Matrix.model_fields[name]
        if raw is None:
            return field.get_default(call_default_factory=True)
        return model.model_validate(raw) if model is not None else raw

    @property
    def name(self) -> str | None:
        return self.matrix.name if self.matrix is not None else self.matrix_json.get("name")

    @property
    def baseline(self) -> dict[str, Any]:
        return self.section("baseline")

    @property
    def tolerances(self) -> Tolerances:
        return self.section("tolerances", Tolerances)

    @property
    def measure(self) -> Measure:
        return self.section("measure", Measure)

    @property
    def sampling(self) -> Sampling | None:
        """measure.sampling, read on its own: a run whose measure section today's models refuse still says
        whether (and how) it sampled."""
        if self.matrix is not None:
            return self.matrix.measure.sampling
        raw = (self.matrix_json.get("measure") or {}).get("sampling")
        return Sampling.model_validate(raw) if raw else None

    def sampling_for(self, framework: str, flags: str) -> Sampling | None:
        """The sampling settings a flag set's cells drew with (its override of measure.sampling); a run
        whose matrix today's models refuse: measure.sampling alone."""
        if self.matrix is not None and flags in self.matrix.flag_sets(framework):
            return self.matrix.sampling_for(framework, flags)
        return self.sampling

    @property
    def tasks(self) -> list:
        return self.section("tasks")

    def to_json(self) -> dict[str, Any]:
        out = self.model_dump(mode="json")
        out["matrix"] = self.matrix.model_dump(mode="json") if self.matrix is not None else self.matrix_json
        return out


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


@functools.cache   # the same for the run's start and end writes (24 metadata look-ups, NVML, /proc)
def _driver_facts() -> tuple[dict, dict]:
    from adapters import ADAPTERS

    packages = dict.fromkeys([*_DRIVER_PACKAGES, *(p for name in ADAPTERS for p in ADAPTERS[name].packages)])
    return host_facts().model_dump(mode="json"), {p: v for p in packages if (v := _version(p))}


def write(store, m: Matrix, text: str, cells: list[Cell], started: str, ended: str | None = None) -> None:
    """Write `store`'s (a RunStore's) manifest for a session of `bench run` that started at `started`
    (and, once it ended, `ended`), keeping its earlier sessions."""
    store.write_manifest(for_run(store.read_manifest(), store.run_id, m, text, cells, started, ended))


def for_run(previous: Manifest, run_id: str, m: Matrix, text: str, cells: list[Cell], started: str,
            ended: str | None = None) -> Manifest:
    """The manifest of a run session: `previous` (what the run dir holds) with this session's start, or end."""
    sessions = [s for s in previous.sessions if s.started != started]
    sessions.append(Session(started=started, ended=ended))
    facts, versions = _driver_facts()
    return Manifest(schema_version=SCHEMA_VERSION, run_id=run_id, matrix_text=text, matrix=m,
                    cells=[{"cell_id": c.cell_id, "engine_key": c.engine_key, **c.axes()} for c in cells],
                    host=facts, driver_versions=versions, sessions=sessions)
