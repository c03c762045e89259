"""`bench explain --layers`, the engine side: the engine's residual stream after every block on the run's scoring
prompts (Adapter.hidden_states), `repeats` times, into hidden.npz: `r{repeat}_p{prompt}` -> [layers + 1, positions,
hidden] float32; or, where the engine cannot expose it, `unsupported` -> the reason (a 0-d string array)."""

from __future__ import annotations

import numpy as np

from adapters.base import Adapter, Unsupported
from adapters.contract.specs import HiddenSpec


def capture(adapter: Adapter, spec: HiddenSpec) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    try:
        for r in range(spec.repeats):
            for i, h in enumerate(adapter.hidden_states(spec.prompts)):
                out[f"r{r}_p{i}"] = np.asarray(h, np.float32)
    except Unsupported as err:
        return {"unsupported": np.array(str(err))}
    return out
