"""Request traces, read the same way by `bench validate` (does it exist and parse?) and by the run (the
requests), in two shapes told apart by the file's suffix:

- Mooncake's JSONL (any suffix but .csv): one request a line, `timestamp` (ms since the trace's start),
  `input_length`, `output_length` (tokens) and `hash_ids` (one id per block of the prompt; requests sharing an
  id share that block: what a prefix cache can reuse). Lines are in time order.
- BurstGPT's CSV (`.csv`): a header naming `Timestamp` (seconds), `Request tokens` and `Response tokens`
  (other columns, such as Model and Log Type, are read past); no prefix sharing. Its logs hold failed
  requests with 0 response tokens: those rows are dropped and counted, never replayed as 1-token requests.

A request's prompt is its blocks' tokens in order (each block drawn once per hash id, seeded), cut to its
input_length; where the blocks are shorter than input_length the rest is the request's own tokens.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.inputs.datasets import DatasetError


class TraceRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")   # Mooncake's traces may carry more fields

    timestamp: float = Field(ge=0, allow_inf_nan=False)
    input_length: int = Field(ge=1)
    output_length: int = Field(ge=1)
    hash_ids: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)


class Trace(BaseModel):
    """A trace's requests in time order, and the rows its file held that are no request (BurstGPT's failures)."""

    records: list[TraceRecord]
    dropped: int = 0
    shape: str = "mooncake"


BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")


def read_trace(path: str | Path) -> Trace:
    """Every request of the trace, in order; a line that is no request, or out of time order, is an error
    naming the file and the line."""
    path = Path(path)
    shape, (lines, dropped) = ("burstgpt", _read_burstgpt(path)) if path.suffix.lower() == ".csv" else (
        "mooncake", (_read_mooncake(path), 0))
    for (_, before), (lineno, rec) in zip(lines, lines[1:]):
        if rec.timestamp < before.timestamp:
            raise DatasetError(f"{path}: line {lineno}: timestamp {rec.timestamp:g} is before the previous "
                               f"request's {before.timestamp:g} (a trace is in time order)")
    if not lines:
        raise DatasetError(f"{path}: holds no requests" + (f" ({dropped} rows with 0 tokens dropped)"
                                                          if dropped else ""))
    records = [rec for _, rec in lines]
    if shape == "burstgpt":   # BurstGPT's clock starts where its log does: times from the first request kept
        records = [r.model_copy(update={"timestamp": r.timestamp - records[0].timestamp}) for r in records]
    return Trace(records=records, dropped=dropped, shape=shape)


def _read_mooncake(path: Path) -> list[tuple[int, TraceRecord]]:
    out = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append((lineno, TraceRecord.model_validate(json.loads(line))))
        except json.JSONDecodeError as err:
            raise DatasetError(f"{path}: line {lineno} is not valid JSON ({err})") from None
        except ValidationError as err:
            raise DatasetError(f"{path}: line {lineno}: {_first_error(err)} (a trace line holds timestamp (ms), "
                               "input_length, output_length and hash_ids)") from None
    return out


def _read_burstgpt(path: Path) -> tuple[list[tuple[int, TraceRecord]], int]:
    """Its requests (timestamps in ms, as Mooncake's) and how many rows were failures (0 tokens)."""
    with path.open(newline="") as f:
        rows = csv.DictReader(f)
        missing = [c for c in BURSTGPT_COLUMNS if c not in (rows.fieldnames or [])]
        if missing:
            raise DatasetError(f"{path}: a .csv trace is read as BurstGPT's, whose header names "
                               f"{', '.join(BURSTGPT_COLUMNS)}; missing: {', '.join(missing)}")
        out, dropped = [], 0
        for lineno, row in enumerate(rows, 2):
            try:
                ts, n_in, n_out = (float(row["Timestamp"]), int(row["Request tokens"]), int(row["Response tokens"]))
            except (TypeError, ValueError):
                raise DatasetError(f"{path}: line {lineno}: Timestamp, Request tokens and Response tokens must be "
                                   f"numbers, got {[row[c] for c in BURSTGPT_COLUMNS]}") from None
            if n_in == 0 or n_out == 0:
                dropped += 1   # a failed request in BurstGPT's logs
                continue
            try:
                out.append((lineno, TraceRecord(timestamp=ts * 1e3, input_length=n_in, output_length=n_out)))
            except ValidationError as err:
                raise DatasetError(f"{path}: line {lineno}: {_first_error(err)}") from None
    return out, dropped


def _first_error(err: ValidationError) -> str:
    first = err.errors()[0]
    return f"{'.'.join(str(x) for x in first['loc']) or '(line)'}: {first['msg']}"


def check(path: str) -> str | None:
    """Why the file cannot serve as a trace (None: it can)."""
    p = Path(path)
    if not p.is_file():
        return f"{path}: no such file (mark it cluster_only: true if it exists only where the run happens)"
    try:
        read_trace(p)
    except (DatasetError, UnicodeDecodeError, OSError) as err:
        return str(err)
    return None


def gaps_s(records: list[TraceRecord], n: int, time_scale: float) -> list[float]:
    """Seconds before each of n requests (the trace cycled): its timestamp's distance from the previous
    request's, x time_scale; 0 before the very first, and the trace's mean gap between two cycles."""
    ts = np.array([r.timestamp for r in records]) / 1e3 * time_scale
    inner = np.diff(ts)
    between = float(inner.mean()) if len(inner) else 0.0
    return [0.0 if i == 0 else (between if i % len(records) == 0 else float(inner[i % len(records) - 1]))
            for i in range(n)]


def prompts(records: list[TraceRecord], n: int, allowed: np.ndarray, block_size: int, seed: int,
            input_cap: int) -> tuple[list[list[int]], int]:
    """Each of n requests' prompt ids (the trace cycled), cut at input_cap; and how many requests' blocks
    were shorter than their input_length (topped up with tokens of their own)."""
    blocks: dict[int, list[int]] = {}
    out, short = [], 0
    for i in range(n):
        rec = records[i % len(records)]
        length = min(rec.input_length, input_cap)
        ids: list[int] = []
        for h in rec.hash_ids:
            if len(ids) >= length:
                break
            if h not in blocks:
                blocks[h] = np.random.default_rng([seed, 0, h]).choice(allowed, block_size).tolist()
            ids += blocks[h]
        if len(ids) < length:
            short += 1
            ids += np.random.default_rng([seed, 1, i % len(records)]).choice(allowed, length - len(ids)).tolist()
        out.append(ids[:length])
    return out, short
