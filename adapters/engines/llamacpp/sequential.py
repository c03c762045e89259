"""The llama.cpp adapter's sequential path: prompt-lookup speculative decoding through llama-cpp-python's
high-level `Llama.generate` with `LlamaPromptLookupDecoding`, one sequence at a time (batch_mode
"sequential"), with the drafts counted. A mixin of `LlamacppAdapter` (adapters/engines/llamacpp/adapter.py),
which holds the state these methods use."""

from __future__ import annotations

import time

import numpy as np

from adapters.base import log_softmax
from adapters.contract.records import TokenScores, topk_dense
from adapters.contract.specs import SamplerSettings
from adapters.contract.timing import TimedRun, per_token_run
from adapters.engines.llamacpp.gguf_convert import captured_llama_logs
from adapters.engines.llamacpp.native import (
    CTX_ROUND,
    FLASH_ATTN_TYPES,
    KV_TYPES,
    check_seed,
    llama_defaults,
    sampled_scores,
)


class PromptLookupDecoding:
    """Prompt-lookup decoding on a llama_cpp.Llama, one prompt after another."""

    def _ensure_llama(self, tokens: int, logs: list[str] | None = None) -> None:
        import llama_cpp
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        need = tokens + self.opts.num_pred_tokens + 1  # drafts may run past the last kept token
        if self.opts.n_ctx and need > self.opts.n_ctx:
            raise ValueError(f"a request needs {need} tokens (with drafts) but n_ctx is {self.opts.n_ctx}")
        if self._llm is not None and need <= self._llm.n_ctx():
            return
        n_ctx = self.opts.n_ctx or -(-need // CTX_ROUND) * CTX_ROUND
        if self._llm is not None:
            self._llm.close()
            self._llm = None
        kwargs = dict(n_gpu_layers=self.n_gpu_layers, n_ctx=n_ctx, n_batch=self.opts.n_batch,
                      n_ubatch=min(self.opts.n_ubatch, self.opts.n_batch), n_threads=self.n_threads,
                      n_threads_batch=self.n_threads, flash_attn=self.flash_attn == "on",
                      type_k=KV_TYPES[self.opts.type_k][0] if self.opts.type_k else None,
                      type_v=KV_TYPES[self.opts.type_v][0] if self.opts.type_v else None,
                      draft_model=self._counting_drafter(LlamaPromptLookupDecoding),
                      logits_all=True, seed=self.spec.seed, verbose=False)
        own_logs = logs if logs is not None else []
        with llama_defaults(self.opts.use_extra_bufts, FLASH_ATTN_TYPES[self.flash_attn]), captured_llama_logs(own_logs):
            self._llm = llama_cpp.Llama(self.gguf_path, **kwargs)
        self._n_vocab = self._llm.n_vocab()
        if logs is None:
            self._record_context(own_logs)

    def _fresh_llm(self, prompt: list[int], extra: int) -> None:
        self._ensure_llama(len(prompt) + extra)
        if not self.opts.keep_kv_between_runs:
            self._llm.reset()
            self._L.llama_memory_clear(self._L.llama_get_memory(self._llm.ctx), True)

    def _greedy_stream(self, prompt: list[int]):
        # temp=0 -> llama-cpp-python's greedy sampler; reset=True lets Llama reuse a cached prefix only
        # when keep_kv_between_runs left one there (otherwise _fresh_llm emptied it)
        return self._llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                                  reset=True)

    def _generate_sequential(self, prompts: list[list[int]], output_len: int | list[int], ignore_eos: bool) -> TimedRun:
        L = self._L
        lens = [output_len] * len(prompts) if isinstance(output_len, int) else list(output_len)
        for p, n in zip(prompts, lens):
            self._ensure_llama(len(p) + n)  # any context rebuild happens before the clock starts
        times: list[list[float]] = []
        engine_ttft: list[float] = []
        drafted: list[tuple[list[int], list[int], list]] = []   # per prompt: its tokens, output, draft calls
        start = time.perf_counter()
        for p, output_len in zip(prompts, lens):
            self._fresh_llm(p, output_len)
            ctx = self._llm.ctx
            L.llama_perf_context_reset(ctx)
            ts: list[float] = []
            out: list[int] = []
            for token in self._greedy_stream(p):
                ts.append(time.perf_counter())
                out.append(token)
                if len(ts) == 1:
                    perf = L.llama_perf_context(ctx)
                    engine_ttft.append((perf.t_p_eval_ms + perf.t_eval_ms) / 1e3)
                if len(ts) >= output_len or (not ignore_eos and self._llm.token_eos() == token):
                    break
            times.append(ts)
            drafted.append((p, out, self._drafter.take()))
        end = time.perf_counter()
        for p, out, calls in drafted:   # counted after the clock stopped
            self._tally_drafts(p, out, calls)
        # the batch was handed over at `start`: a request's TTFT includes its wait behind the ones before it
        return per_token_run(start, end, times, prompts, engine_ttft)

    def _score_one(self, prompt: list[int], top_k: int) -> TokenScores:
        self._ensure_llama(len(prompt))
        self._llm.reset()
        self._L.llama_memory_clear(self._L.llama_get_memory(self._llm.ctx), True)
        self._llm.eval(prompt)
        lp = log_softmax(np.array(self._llm.scores[: len(prompt) - 1]))
        return topk_dense(lp, np.asarray(prompt[1:], np.int64), top_k)

    def _greedy_one(self, prompt: list[int], n_tokens: int, top_k: int) -> TokenScores:
        self._fresh_llm(prompt, n_tokens)
        tokens: list[int] = []
        for token in self._greedy_stream(prompt):
            tokens.append(int(token))
            if len(tokens) >= n_tokens:
                break
        self._tally_drafts(prompt, tokens, self._drafter.take())
        # row i of Llama.scores holds the logits after position i; token j was chosen from row n-1+j
        rows = np.array(self._llm.scores[len(prompt) - 1: len(prompt) - 1 + n_tokens])
        return topk_dense(log_softmax(rows), np.asarray(tokens, np.int64), top_k)

    def _sample_one(self, prompt: list[int], seed: int, settings: SamplerSettings, n_tokens: int) -> TokenScores:
        """Prompt-lookup mode: llama-cpp-python's Llama.generate, whose sampler chain (penalties off,
        top_k, typical off, top_p, min_p, temp, dist(seed)) is built afresh on every call with the seed
        set_seed gave it; with the draft model it samples each verified position in order with that one
        chain, so the ids are those of plain sampling with the same seed."""
        check_seed(seed)
        self._fresh_llm(prompt, n_tokens)
        self._llm.set_seed(seed)
        tokens: list[int] = []
        for token in self._llm.generate(prompt, top_k=settings.top_k, top_p=settings.top_p, min_p=settings.min_p,
                                        typical_p=1.0, temp=settings.temperature, repeat_penalty=1.0,
                                        frequency_penalty=0.0, presence_penalty=0.0, reset=True):
            tokens.append(int(token))
            if len(tokens) >= n_tokens:
                break
        self._tally_drafts(prompt, tokens, self._drafter.take())
        rows = np.array(self._llm.scores[len(prompt) - 1: len(prompt) - 1 + n_tokens])
        return sampled_scores(log_softmax(rows), tokens)

    # prompt-lookup acceptance: llama-cpp-python counts nothing, so the draft model is wrapped and every
    # draft it returns is kept with the position it starts at; after a sequence, a draft's accepted tokens
    # are its longest prefix that the sequence (prompt + output) holds from that position (Llama.generate
    # keeps a draft token only while each sampled token equals it). Drafts past the output taken count as
    # proposed and not accepted.
    def _counting_drafter(self, base):
        if self._drafter is None:
            adapter = self

            class CountingPromptLookup(base):
                def __init__(self, **kwargs) -> None:
                    super().__init__(**kwargs)
                    self.calls: list[tuple[int, list[int]]] = []

                def __call__(self, input_ids, /, **kwargs):
                    draft = super().__call__(input_ids, **kwargs)
                    room = adapter._llm.n_ctx() - len(input_ids) if adapter._llm is not None else len(draft)
                    self.calls.append((len(input_ids), [int(t) for t in draft[:max(room, 0)]]))
                    return draft

                def take(self) -> list[tuple[int, list[int]]]:
                    calls, self.calls = self.calls, []
                    return calls

            self._drafter = CountingPromptLookup(max_ngram_size=self.opts.max_ngram_size,
                                                 num_pred_tokens=self.opts.num_pred_tokens)
        return self._drafter

    def _tally_drafts(self, prompt: list[int], output: list[int], calls: list[tuple[int, list[int]]]) -> None:
        seq = [int(t) for t in prompt] + [int(t) for t in output]
        for start, draft in calls:
            n = 0
            while n < len(draft) and start + n < len(seq) and seq[start + n] == draft[n]:
                n += 1
            self._spec[0] += len(draft)
            self._spec[1] += n
