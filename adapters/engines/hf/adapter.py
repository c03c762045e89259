"""Hugging Face transformers: the reference engine. CPU and CUDA; fp32/fp16/bf16."""

from __future__ import annotations

import time
from typing import Literal

import numpy as np

from adapters.base import Adapter, EngineOptions, NumericsFlag, SeedPromise, log_softmax, no_cuda_reason, one_length, register
from adapters.contract.events import LoadFacts
from adapters.contract.records import TokenScores, topk_dense
from adapters.contract.specs import LoadSpec, SamplerSettings
from adapters.contract.timing import TimedRun, per_token_run

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


class HfOptions(EngineOptions):
    attn_implementation: Literal["eager", "sdpa"] | None = None
    static_cache: bool = False          # cache_implementation="static" (fixed shapes, needed by compile)
    compile: bool = False               # torch.compile the forward pass
    num_threads: int | None = None      # torch intra-op threads on CPU


@register
class HfAdapter(Adapter):
    name = "hf"
    Options = HfOptions
    # `bench explain`'s suspects (the reference side: transformers' defaults, no compile)
    numerics_flags = (
        NumericsFlag("attention", {"attn_implementation": None}, "the attention implementation (eager, sdpa)"),
        NumericsFlag("compile", {"compile": False, "static_cache": False}, "torch.compile and the static cache"),
        NumericsFlag("threads", {"num_threads": None}, "torch's intra-op threads"),
    )
    quantizations = tuple(DTYPES)
    install_hint = "pip install -e '.[hf]'"
    requires_modules = ("torch", "transformers")
    sampler_order = ("temperature", "top_k", "top_p", "min_p")     # its warpers' order (_seeded_sampler)
    load_fixed_s, cell_speed, packages = 10.0, 2.5, ("torch", "transformers")   # the scheduler's priors; the manifest
    seed_promises = (SeedPromise("transformers", ">=4.40", same_batch=True, across_batch=False,
                                 source="each request draws from its own torch.Generator (adapters/engines/hf/adapter.py); "
                                 "transformers makes no batch-invariance claim: padding and batched matmuls change "
                                 "the logits' rounding"),)
    no_server_reason = ("`transformers serve` has /v1/completions, but it ignores logprobs and token-id prompts, "
                        "so its outputs cannot be compared; the reference runs offline")

    def check(self, spec: LoadSpec) -> str | None:
        return no_cuda_reason("transformers on cuda") if spec.device == "cuda" else None

    def load(self, spec: LoadSpec) -> LoadFacts:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, GenerationConfig

        opts = HfOptions(**spec.options)
        torch.manual_seed(spec.seed)
        if opts.num_threads:
            torch.set_num_threads(opts.num_threads)
        self.torch = torch
        self.device = torch.device("cuda" if spec.device == "cuda" else "cpu")
        args = dict(dtype=getattr(torch, DTYPES[spec.quantization]),
                    trust_remote_code=spec.model.trust_remote_code)
        if spec.model.revision:
            args["revision"] = spec.model.revision
        if opts.attn_implementation:
            args["attn_implementation"] = opts.attn_implementation
        model = AutoModelForCausalLM.from_pretrained(spec.model.source, **args).to(self.device).eval()
        if opts.compile:
            model.forward = torch.compile(model.forward)
        self.model = model
        self.pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
        # Fresh greedy configs, not the checkpoint's (which may carry penalties or sampling):
        # greedy must be the argmax of the raw logits. One stops at EOS, one never does.
        eos = model.generation_config.eos_token_id
        common = dict(do_sample=False, pad_token_id=self.pad_id,
                      cache_implementation="static" if opts.static_cache else None)
        self.gen_eos = GenerationConfig(eos_token_id=eos, **common)
        self.gen_no_eos = GenerationConfig(eos_token_id=None, **common)
        # generate() fills a passed config's unset (default-valued) fields from the model's own
        # generation_config, so eos_token_id=None there becomes the checkpoint's EOS again (transformers
        # 5.24, _prepare_generation_config: update(..., defaults_only=True)); an explicit keyword does not
        self.no_eos = dict(generation_config=self.gen_no_eos, eos_token_id=None)
        info = LoadFacts(
            versions={"torch": torch.__version__, "transformers": transformers.__version__},
            engine_args={k: str(v) for k, v in args.items()} | opts.model_dump(exclude_none=True),
        )
        if self.device.type == "cuda":
            info.versions["cuda"] = str(torch.version.cuda)
            info.notes.append(f"gpu: {torch.cuda.get_device_name(self.device)}")
        return info

    # -- helpers -----------------------------------------------------------------------------
    def _sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def _left_padded(self, prompts: list[list[int]]):
        torch = self.torch
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        return ids.to(self.device), mask.to(self.device)

    # -- the interface -----------------------------------------------------------------------
    no_stream_reason = ("transformers' generate has no continuous-batching scheduler (a static batch per call): "
                        "stream cells would be an emulation")

    def generate(self, prompts, output_len, ignore_eos) -> TimedRun:
        output_len = one_length(output_len, "transformers generate (max_new_tokens)")
        clock = _step_clock()
        ids, mask = self._left_padded(prompts)
        with self.torch.inference_mode():
            self._sync()
            start = time.perf_counter()
            out = self.model.generate(ids, attention_mask=mask, max_new_tokens=output_len,
                                      **(self.no_eos if ignore_eos else {"generation_config": self.gen_eos}),
                                      streamer=clock)
            self._sync()
            end = time.perf_counter()
        stamps = clock.times[1:]   # the first put is the prompt
        new = out[:, ids.shape[1]:].cpu().numpy()
        counts = [self._generated_count(row) if not ignore_eos else new.shape[1] for row in new]
        return per_token_run(start, end, [stamps[:n] for n in counts], prompts)

    def _generated_count(self, row: np.ndarray) -> int:
        eos = self.gen_eos.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos])
        for i, tok in enumerate(row):
            if int(tok) in eos:
                return i + 1
        return len(row)

    def score(self, prompts, top_k) -> list[TokenScores]:
        torch = self.torch
        width = max(len(p) for p in prompts)
        # right padding: positions before the padding see exactly their own prefix
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, :len(p)] = torch.tensor(p)
            mask[i, :len(p)] = 1
        with torch.inference_mode():
            logits = self.model(ids.to(self.device), attention_mask=mask.to(self.device)).logits
        out = []
        for i, p in enumerate(prompts):
            lp = log_softmax(logits[i, : len(p) - 1].float().cpu().numpy())
            out.append(topk_dense(lp, np.asarray(p[1:]), top_k))
        return out

    def hidden_states(self, prompts) -> list[np.ndarray]:
        # one prompt per forward pass: no padding, so every position is the prompt's own
        torch, out = self.torch, []
        with torch.inference_mode():
            for p in prompts:
                ids = torch.tensor([p], dtype=torch.long, device=self.device)
                hs = self.model(ids, output_hidden_states=True).hidden_states
                out.append(torch.stack([h[0] for h in hs]).float().cpu().numpy())
        return out

    def residual_states(self, prompts) -> list[np.ndarray]:
        """The residual after each block's attention: the input of its `post_attention_layernorm` (Llama-style
        decoder layers: Llama, Qwen2, Mistral), taken by a forward pre-hook; other layouts are Unsupported."""
        layers = getattr(getattr(self.model, "model", None), "layers", None)
        norms = [getattr(layer, "post_attention_layernorm", None) for layer in layers or []]
        if not norms or any(n is None for n in norms):
            raise Unsupported(f"hf: {type(self.model).__name__}'s blocks have no post_attention_layernorm to split at")
        mids: list = []
        hooks = [n.register_forward_pre_hook(lambda _m, args: mids.append(args[0][0].float().cpu().numpy())) for n in norms]
        out = []
        try:
            for p in prompts:
                mids.clear()
                (blocks,) = self.hidden_states([p])
                out.append(np.stack([blocks[0], *(a for i in range(len(norms)) for a in (mids[i], blocks[i + 1]))]))
        finally:
            for h in hooks:
                h.remove()
        return out

    def greedy(self, prompts, n_tokens, top_k) -> list[TokenScores]:
        ids, mask = self._left_padded(prompts)
        with self.torch.inference_mode():
            out = self.model.generate(ids, attention_mask=mask, max_new_tokens=n_tokens,
                                      **self.no_eos, output_logits=True, return_dict_in_generate=True)
        new = out.sequences[:, ids.shape[1]:].cpu().numpy()
        # raw logits per step, [steps, batch, vocab] -> per prompt [steps, vocab]
        logits = self.torch.stack(out.logits).float().cpu().numpy()
        return [topk_dense(log_softmax(logits[:, i]), new[i], top_k) for i in range(len(prompts))]

    def sample(self, prompts, seeds, settings: SamplerSettings, n_tokens) -> list[TokenScores]:
        """Seeded sampling with one torch.Generator per request. `generate` has no per-request seed (its
        do_sample draws one torch.multinomial for the whole batch from the global RNG, so a request's
        sample depends on its batch), so the draw happens in a LogitsProcessor under do_sample=False:
        transformers' own warpers, in its order (temperature -> top_k -> top_p -> min_p, each only when
        the settings turn it on), softmax, then torch.multinomial of each row with its own generator;
        the processor leaves only the drawn token finite, and generate's argmax takes it. That is what
        do_sample=True does for one row (same warpers, same multinomial). The logprobs are the raw
        logits' log-softmax (output_logits, before any processor)."""
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        processor = _seeded_sampler(self.torch, [int(s) for s in seeds], settings, self.device)
        from transformers import LogitsProcessorList

        ids, mask = self._left_padded(prompts)
        with self.torch.inference_mode():
            out = self.model.generate(ids, attention_mask=mask, max_new_tokens=n_tokens,
                                      **self.no_eos, logits_processor=LogitsProcessorList([processor]),
                                      output_logits=True, return_dict_in_generate=True)
        new = out.sequences[:, ids.shape[1]:].cpu().numpy()
        logits = self.torch.stack(out.logits).float().cpu().numpy()
        return [topk_dense(log_softmax(logits[:, i]), new[i], 0) for i in range(len(prompts))]

    def close(self) -> None:
        self.model = None
        if getattr(self, "device", None) is not None and self.device.type == "cuda":
            self.torch.cuda.empty_cache()


def _step_clock():
    """generate's streamer, as a clock: generate calls put() once with the prompt, then once per step right
    after the step's tokens are chosen (with `tokens.cpu()`, so on a GPU once they are on the host); each
    put appends perf_counter() to `.times`. (It replaced a StoppingCriteria, which added a torch op a step,
    `is_done | ours`, and before that a LogitsProcessor, called before the choice: 4-5% on the built-in model,
    benchmarks/overhead.py, paired table.)"""
    from transformers.generation.streamers import BaseStreamer

    clock = BaseStreamer()
    clock.times = []
    append, now = clock.times.append, time.perf_counter
    clock.put = lambda value: append(now())   # instance attributes: no method binding per call
    clock.end = lambda: None
    return clock


def _seeded_sampler(torch, seeds: list[int], settings: SamplerSettings, device):
    """A LogitsProcessor that samples each row with its own generator (see HfAdapter.sample)."""
    from transformers import LogitsProcessor
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    # transformers' _get_logits_processor for do_sample, with the switches it uses (top_k 0 is off, and
    # never its GenerationConfig default of 50; min_tokens_to_keep 1 as for a single beam)
    warpers = []
    if settings.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(settings.temperature))
    if settings.top_k:
        warpers.append(TopKLogitsWarper(top_k=settings.top_k))
    if settings.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=settings.top_p))
    if settings.min_p:
        warpers.append(MinPLogitsWarper(min_p=settings.min_p))

    class SeededSampler(LogitsProcessor):
        def __init__(self) -> None:
            self.warpers = warpers
            self.generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]

        def __call__(self, input_ids, scores):
            for w in self.warpers:
                scores = w(input_ids, scores)
            probs = torch.nn.functional.softmax(scores, dim=-1)
            tokens = torch.stack([torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(self.generators)])
            return torch.full_like(scores, -float("inf")).scatter_(1, tokens, 0.0)

    return SeededSampler()
