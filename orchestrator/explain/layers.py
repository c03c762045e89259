"""`bench explain --layers`, its arithmetic: where along the depth a cell's residual stream leaves its baseline's
noise floor. Inputs are Adapter.hidden_states captures (one [layers + 1, positions, hidden] array per prompt:
index 0 the embeddings, index i the output of block i - 1). Pure numpy; the capture itself runs elsewhere."""

from __future__ import annotations

import numpy as np


def relative_errors(cell: list[np.ndarray], base: list[np.ndarray]) -> np.ndarray:
    """Per capture index: ||h_cell - h_base|| / ||h_base||, pooled over every prompt and position."""
    num = sum(((c.astype(np.float64) - b) ** 2).sum(axis=(1, 2)) for c, b in zip(cell, base, strict=True))
    den = sum((b.astype(np.float64) ** 2).sum(axis=(1, 2)) for b in base)
    return np.sqrt(num / np.maximum(den, np.finfo(np.float64).tiny))


def floor(repeats: list[list[np.ndarray]]) -> np.ndarray:
    """The baseline's own floor per capture index: the largest relative error between any of its captures
    (repeats, batch sizes) and the first one."""
    first = repeats[0]
    errs = [relative_errors(r, first) for r in repeats[1:]]
    return np.max(errs, axis=0) if errs else np.zeros(len(first[0]))


def layer_report(errors: np.ndarray, noise: np.ndarray, margin: float = 2.0, atol: float = 1e-6) -> dict:
    """Blocks numbered from 0 (capture index i + 1). `first_beyond`: the first block whose output error exceeds
    margin x its floor + atol (None: none does); `grows_most`: the block with the largest error increase over its
    input. Layers before `first_beyond` sit within the floor by construction."""
    beyond = errors > margin * noise + atol
    blocks = [int(i) - 1 for i in np.flatnonzero(beyond[1:]) + 1]
    growth = np.diff(errors)
    first = blocks[0] if blocks else None
    most = int(np.argmax(growth)) if len(growth) and growth.max() > atol else None
    rows = [{"layer": i - 1, "name": "embeddings" if i == 0 else f"block {i - 1}", "rel_error": float(errors[i]),
             "floor": float(noise[i]), "beyond_floor": bool(beyond[i])} for i in range(len(errors))]
    if first is None:
        line = "stays within the noise floor at every layer"
    else:
        line = f"leaves the noise floor at layer {first}, grows most in layer {most}"
    return {"first_beyond": first, "grows_most": most, "embeddings_beyond": bool(beyond[0]), "layers": rows,
            "line": line}
