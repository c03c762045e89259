"""`bench explain --layers`, its arithmetic: where along the depth a cell's residual stream leaves its baseline's
noise floor. Inputs are Adapter.hidden_states captures (one [layers + 1, positions, hidden] array per prompt:
index 0 the embeddings, index i the output of block i - 1), or Adapter.residual_states ones (each block split at
the residual after its attention: [2 x layers + 1, ...]). Pure numpy; the capture itself runs elsewhere."""

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


def capture_names(n: int, split: bool) -> list[tuple[int, str | None]]:
    """(layer, part) per capture index: (-1, None) the embeddings; whole blocks (i, None); split blocks (i,
    "attention") then (i, "FFN") (Adapter.residual_states: the residual after the attention, then the block's output)."""
    if not split:
        return [(i - 1, None) for i in range(n)]
    return [(-1, None)] + [((j - 1) // 2, "attention" if j % 2 else "FFN") for j in range(1, n)]


def blocks_only(capture: list[np.ndarray]) -> list[np.ndarray]:
    """A split capture reduced to hidden_states' indices (the embeddings and each block's output)."""
    return [c[0::2] for c in capture]


def _where(name: tuple[int, str | None]) -> str:
    return f"layer {name[0]}" + (f" ({name[1]})" if name[1] else "")


# captures whose growth is at least this share of the largest, next to it, are named with it: "layers 1-2"
GROWS_SHARE = 0.5


def _grows_span(growth: np.ndarray, atol: float) -> tuple[int, int] | None:
    """(first, last) capture index (into the captures, not the diffs) of the contiguous run around the largest
    growth whose every growth is at least GROWS_SHARE of it; None where nothing grows beyond atol."""
    if not len(growth) or growth.max() <= atol:
        return None
    top = int(np.argmax(growth))
    lo = hi = top
    while lo > 0 and growth[lo - 1] >= GROWS_SHARE * growth[top]:
        lo -= 1
    while hi + 1 < len(growth) and growth[hi + 1] >= GROWS_SHARE * growth[top]:
        hi += 1
    return lo + 1, hi + 1


def _span_text(a: tuple[int, str | None], b: tuple[int, str | None]) -> str:
    if a == b:
        return _where(a)
    if a[1] is None and b[1] is None:
        return f"layers {a[0]}-{b[0]}"
    return f"{_where(a)} to {_where(b)}"


def layer_report(errors: np.ndarray, noise: np.ndarray, margin: float = 2.0, atol: float = 1e-6,
                 split: bool = False) -> dict:
    """Blocks numbered from 0. `first_beyond`: the first block with a capture (its output; with `split`, also the
    residual after its attention) whose error exceeds margin x its floor + atol (None: none does); `grows_most`:
    the block with the largest error increase over the capture before it; with `split`, `first_part` and
    `grows_part` say which half of the block ("attention" or "FFN"); `grows_from` / `grows_to`: the blocks of the
    contiguous run of captures around it that each grow by at least GROWS_SHARE of the largest growth (the line
    says "grows most in layers 1-2" where that run spans blocks). Captures before `first_beyond` sit within the
    floor by construction, but for the embeddings (`embeddings_beyond`: then the line names them first)."""
    names = capture_names(len(errors), split)
    beyond = errors > margin * noise + atol
    growth = np.diff(errors)
    at = [i for i in np.flatnonzero(beyond) if i > 0]
    first = names[at[0]] if at else None
    most = names[int(np.argmax(growth)) + 1] if len(growth) and growth.max() > atol else None
    span = _grows_span(growth, atol)
    rows = [{"layer": n[0], "part": n[1], "name": "embeddings" if n[0] < 0 else f"block {n[0]}" + (f" {n[1]}" if n[1] else ""),
             "rel_error": float(errors[i]), "floor": float(noise[i]), "beyond_floor": bool(beyond[i])}
            for i, n in enumerate(names)]
    grows = f", grows most in {_span_text(names[span[0]], names[span[1]])}" if span else ""
    if beyond[0]:   # the token embeddings already differ (a quantized token_embd): said first, blocks still counted
        line = "leaves the noise floor at the embeddings" + grows
    elif first is None:
        line = "stays within the noise floor at every layer"
    else:
        line = f"leaves the noise floor at {_where(first)}" + grows
    return {"first_beyond": first[0] if first else None, "first_part": first[1] if first else None,
            "grows_most": most[0] if most else None, "grows_part": most[1] if most else None,
            "grows_from": names[span[0]][0] if span else None, "grows_to": names[span[1]][0] if span else None,
            "embeddings_beyond": bool(beyond[0]), "split": split, "layers": rows, "line": line}
