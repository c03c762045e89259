"""`bench explain --layers`, the engine side: the engine's residual stream after every block on the run's scoring
prompts (Adapter.hidden_states), `repeats` times, into hidden.npz: `r{repeat}_p{prompt}` -> [layers + 1, positions,
hidden] float32 (split blocks: [2 x layers + 1, ...]) and `split`; or, where the engine cannot expose it,
`unsupported` -> the reason (a 0-d string array)."""

from __future__ import annotations

import numpy as np

from adapters.base import Adapter, Unsupported
from adapters.contract.specs import HiddenSpec


def capture(adapter: Adapter, spec: HiddenSpec) -> dict[str, np.ndarray]:
    """Each block split at its attention where the engine can (Adapter.residual_states; `split` True), else whole
    blocks (Adapter.hidden_states)."""
    out: dict[str, np.ndarray] = {}
    split = True
    try:
        for r in range(spec.repeats):
            try:
                caps = adapter.residual_states(spec.prompts) if split else adapter.hidden_states(spec.prompts)
            except Unsupported:
                if not split:
                    raise
                split, caps = False, adapter.hidden_states(spec.prompts)
            for i, h in enumerate(caps):
                out[f"r{r}_p{i}"] = np.asarray(h, np.float32)
    except Unsupported as err:
        return {"unsupported": np.array(str(err))}
    return out | {"split": np.array(split)}
