"""The numpy reference engine's adapter: what the worker calls (load, generate, score, greedy) and what the driver
reads of it (options, numerics flags, priors, the packages its version is read from)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Literal

import numpy as np

from adapters.base import Adapter, EngineOptions, NumericsFlag, Unsupported, log_softmax, one_length, register
from adapters.contract.events import LoadFacts
from adapters.contract.records import TokenScores, topk_dense
from adapters.contract.specs import LoadSpec, ModelFacts
from adapters.contract.timing import TimedRun, per_token_run


class NumpyOptions(EngineOptions):
    dtype: Literal["float64", "float32"] = "float64"   # the arithmetic's precision (the weights are read as stored)


@register
class NumpyAdapter(Adapter):
    name = "numpy"
    Options = NumpyOptions
    quantizations = ("fp32",)          # the checkpoint's own weights, computed in `dtype`
    requires_modules = ("numpy", "safetensors")
    numerics_flags = (NumericsFlag("precision", {"dtype": "float64"}, "the arithmetic's precision (float64, float32)"),)
    load_fixed_s, cell_speed, packages = 2.0, 1.0, ("numpy",)   # the scheduler's priors; the manifest
    own_environment = False            # numpy and safetensors are in every engine environment
    no_stream_reason = "the numpy reference engine runs one request at a time"
    no_server_reason = "the numpy reference engine has no server"

    @classmethod
    def model_problem(cls, model: ModelFacts, quantization: str, options, device: str) -> str | None:
        from adapters.engines.numpy_ref.model import problem

        if model.kind != "dir":
            return f"the numpy reference engine reads a checkpoint folder (safetensors), not a {model.kind} model"
        return problem(model.config or {})

    def check(self, spec: LoadSpec) -> str | None:
        return "the numpy reference engine runs on the CPU only" if spec.device == "cuda" else None

    def load(self, spec: LoadSpec) -> LoadFacts:
        from adapters.engines.numpy_ref.model import Llama, problem

        folder = Path(spec.model.source)
        config = json.loads((folder / "config.json").read_text())
        why = problem(config)
        if why:
            raise Unsupported(why)
        opts = NumpyOptions(**spec.options)
        self.model = Llama(folder, opts.dtype)
        eos = config.get("eos_token_id")
        self.eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        return LoadFacts(versions={"numpy": np.__version__}, engine_args=opts.model_dump())

    def _decode(self, prompt: list[int], n: int, stop_at_eos: bool, clock: list[float] | None = None):
        """Greedy tokens after `prompt` (at most n), each step's logits; `clock` gets each token's time."""
        logits, cache = self.model.forward(prompt)
        last, tokens, steps = logits[-1], [], []
        for _ in range(n):
            tok = int(np.argmax(last))
            tokens.append(tok)
            steps.append(last)
            if clock is not None:
                clock.append(time.perf_counter())
            if stop_at_eos and tok in self.eos:
                break
            logits, cache = self.model.forward([tok], cache)
            last = logits[-1]
        return tokens, np.stack(steps) if steps else np.zeros((0, self.model.head.shape[0]))

    def generate(self, prompts, output_len, ignore_eos) -> TimedRun:
        n = one_length(output_len, "the numpy reference engine")
        start = time.perf_counter()
        stamps = []
        for p in prompts:      # one request after another: a later request's first token waits for the earlier
            clock: list[float] = []
            self._decode(list(p), n, not ignore_eos, clock)
            stamps.append(clock)
        return per_token_run(start, time.perf_counter(), stamps, prompts)

    def score(self, prompts, top_k) -> list[TokenScores]:
        out = []
        for p in prompts:
            logits, _ = self.model.forward(list(p))
            out.append(topk_dense(log_softmax(logits[: len(p) - 1]), np.asarray(p[1:]), top_k))
        return out

    def greedy(self, prompts, n_tokens, top_k) -> list[TokenScores]:
        out = []
        for p in prompts:
            tokens, steps = self._decode(list(p), n_tokens, stop_at_eos=False)
            out.append(topk_dense(log_softmax(steps), np.asarray(tokens), top_k))
        return out

    def hidden_states(self, prompts) -> list[np.ndarray]:
        out = []
        for p in prompts:
            states: list = []
            self.model.forward(list(p), states=states)
            out.append(np.stack(states).astype(np.float32))
        return out

    def close(self) -> None:
        self.model = None
