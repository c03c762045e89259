"""The llama.cpp adapter's batched path (the default): B prompts as B sequences of one context, the prompts
prefilled together and each decode step one `llama_decode` with a token per live sequence, through
llama.cpp's low-level C API. A mixin of `LlamacppAdapter` (adapters/engines/llamacpp/adapter.py), which holds
the state these methods use."""

from __future__ import annotations

import ctypes
import time
from typing import Any

import numpy as np

from adapters.base import Unsupported
from adapters.engines.llamacpp.gguf_convert import captured_llama_logs
from adapters.engines.llamacpp.native import CTX_ROUND, FLASH_ATTN_TYPES, KV_TYPES, Batch, gguf_head_dim, last_error


class BatchedDecoding:
    """The C-API context, its KV cache and the batched decode loop."""

    def _ensure_context(self, n_seq: int, tokens_per_seq: int, logs: list[str] | None = None) -> None:
        """A context holding n_seq sequences of tokens_per_seq tokens; rebuilt (outside any timing) only
        when a call needs more. A rebuilt context starts with an empty KV cache."""
        L = self._L
        max_seq = L.llama_max_parallel_sequences()
        if n_seq > max_seq:
            raise Unsupported(f"llama.cpp runs at most {max_seq} parallel sequences; batch of {n_seq} asked")
        if self.opts.n_ctx and tokens_per_seq > self.opts.n_ctx:
            raise ValueError(f"a request needs {tokens_per_seq} tokens per sequence but n_ctx is {self.opts.n_ctx}")
        if self._ctx and n_seq <= self._ctx_seqs and tokens_per_seq <= self._ctx_len:
            return
        per_seq = self.opts.n_ctx or -(-max(tokens_per_seq, self._ctx_len) // CTX_ROUND) * CTX_ROUND
        n_seq = max(n_seq, self._ctx_seqs)
        if self._ctx:
            L.llama_free(self._ctx)
            self._ctx = None
        cp = L.llama_context_default_params()
        cp.n_ctx = per_seq * n_seq  # split evenly between sequences unless kv_unified (then shared)
        cp.n_batch = self.opts.n_batch
        cp.n_ubatch = min(self.opts.n_ubatch, self.opts.n_batch)
        cp.n_seq_max = n_seq
        cp.n_threads = cp.n_threads_batch = self.n_threads
        cp.flash_attn_type = FLASH_ATTN_TYPES[self.flash_attn]
        if self.opts.type_k:
            cp.type_k = KV_TYPES[self.opts.type_k][0]
        if self.opts.type_v:
            cp.type_v = KV_TYPES[self.opts.type_v][0]
        cp.kv_unified = self.opts.kv_unified
        cp.no_perf = False
        own_logs = logs if logs is not None else []
        with captured_llama_logs(own_logs):
            self._ctx = L.llama_init_from_model(self._model, cp)
        if not self._ctx:
            raise RuntimeError(f"llama.cpp could not create a context ({n_seq} sequences x {per_seq} tokens): "
                               f"{last_error(own_logs)}")
        self._ctx_seqs = n_seq
        self._ctx_len = min(per_seq, L.llama_n_ctx_seq(self._ctx))
        self._n_ctx_total = L.llama_n_ctx(self._ctx)
        # llama.cpp clamps n_batch to n_ctx: a llama_decode call may carry at most llama_n_batch tokens
        self._batch = Batch(L, L.llama_n_batch(self._ctx))
        self._cached = {}
        self._logits_key = None
        if logs is None:
            self._record_context(own_logs)

    def _record_context(self, logs: list[str]) -> None:
        if self.info is None:
            return
        args = self.info.engine_args
        if self._llm is not None:
            args["n_ctx_per_seq"] = self._llm.n_ctx()
            args["n_seq_max"] = 1
            self.info.kv_budget_bytes = self._kv_bytes(self._llm.model, self._llm.n_ctx())
        elif self._ctx:
            args["n_ctx_per_seq"] = self._ctx_len
            args["n_ctx_total"] = self._n_ctx_total
            args["n_seq_max"] = self._ctx_seqs
            self.info.kv_budget_bytes = self._kv_bytes(self._model, self._n_ctx_total)
        if self.flash_attn != "auto":
            args["flash_attn_resolved"] = self.flash_attn
        for line in logs:  # llama.cpp resolves flash_attn=auto while it reserves the graphs
            if "Flash Attention enabled" in line:
                args["flash_attn_resolved"] = "on"
            elif "Flash Attention not supported" in line:
                args["flash_attn_resolved"] = "off"

    def _kv_bytes(self, model, n_ctx: int) -> int:
        L = self._L
        n_layer, n_head, n_head_kv = L.llama_model_n_layer(model), L.llama_model_n_head(model), L.llama_model_n_head_kv(model)
        head_dim = self.info.engine_args.get("head_dim") if self.info else None
        if not head_dim:
            head_dim = gguf_head_dim(self.gguf_path) or L.llama_model_n_embd(model) // max(n_head, 1)
            if self.info:
                self.info.engine_args["head_dim"] = head_dim
        kb = KV_TYPES[self.opts.type_k or "f16"][1]
        vb = KV_TYPES[self.opts.type_v or "f16"][1]
        return int(n_ctx * n_layer * n_head_kv * head_dim * (kb + vb))

    def _memory(self):
        return self._L.llama_get_memory(self._ctx)

    def _clear_kv(self) -> None:
        self._L.llama_memory_clear(self._memory(), True)
        self._cached = {}

    def _decode(self, tokens: np.ndarray, pos: np.ndarray, seq: np.ndarray, out: np.ndarray):
        """llama_decode over chunks of at most n_batch tokens. Yields (indices of output rows in this
        chunk, logits view [rows, vocab]) after each call; the view is valid until the next call."""
        L, batch = self._L, self._batch
        cap = batch.capacity
        for lo in range(0, len(tokens), cap):
            hi = min(lo + cap, len(tokens))
            batch.fill(tokens[lo:hi], pos[lo:hi], seq[lo:hi], out[lo:hi])
            rc = L.llama_decode(self._ctx, batch.struct)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc} ({'no KV slot' if rc == 1 else 'error'}) "
                                   f"for {hi - lo} tokens")
            rows = np.nonzero(out[lo:hi])[0] + lo
            if len(rows):
                ptr = L.llama_get_logits(self._ctx)
                yield rows, np.ctypeslib.as_array(ptr, shape=(len(rows), self._n_vocab))
            else:
                yield rows, None

    def _logits(self, rows: int) -> np.ndarray:
        """The last llama_decode's logits [rows, vocab], a view on llama.cpp's output buffer (valid until the
        next call). The view is made again only when the buffer or the row count changes (~4 us saved a step);
        the buffer's address comes as a plain int (no ctypes pointer objects built per step)."""
        key = (self._logits_addr(self._ctx), rows)
        if key != self._logits_key:
            ptr = ctypes.cast(key[0], ctypes.POINTER(ctypes.c_float))
            self._logits_view, self._logits_key = np.ctypeslib.as_array(ptr, shape=(rows, self._n_vocab)), key
        return self._logits_view

    def _perf_ms(self) -> float:
        p = self._L.llama_perf_context(self._ctx)
        return float(p.t_p_eval_ms + p.t_eval_ms)

    def _run(self, prompts: list[list[int]], n_tokens: int | list[int], stop_at_eos: bool,
             keep_logits: bool) -> dict[str, Any]:
        L = self._L
        B = len(prompts)
        # per sequence: its own output length (a drawn workload), its sequence leaves the batch there
        limits = [n_tokens] * B if isinstance(n_tokens, int) else list(n_tokens)
        n_tokens = max(limits)
        stop_steps = set(limits) if len(set(limits)) > 1 else set()
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt")
        self._ensure_context(B, max(len(p) for p in prompts) + n_tokens)
        # Which prompt tokens must be decoded: all of them, unless the KV cache is kept on purpose and a
        # sequence already holds a prefix (then only the suffix; at least the last token, for its logits).
        starts = [0] * B
        if self.opts.keep_kv_between_runs:
            mem = self._memory()
            for s, p in enumerate(prompts):
                cached = self._cached.get(s, [])
                common = 0
                for a, b in zip(cached, p):
                    if a != b:
                        break
                    common += 1
                common = min(common, len(p) - 1)
                if not L.llama_memory_seq_rm(mem, s, common, -1):
                    L.llama_memory_seq_rm(mem, s, -1, -1)
                    common = 0
                starts[s] = common
            for s in list(self._cached):
                if s >= B:
                    L.llama_memory_seq_rm(mem, s, -1, -1)
                    del self._cached[s]
        else:
            self._clear_kv()

        tok = np.concatenate([np.asarray(p[st:], np.int32) for p, st in zip(prompts, starts)])
        pos = np.concatenate([np.arange(st, len(p), dtype=np.int32) for p, st in zip(prompts, starts)])
        seq = np.concatenate([np.full(len(p) - st, s, np.int32) for s, (p, st) in enumerate(zip(prompts, starts))])
        out = np.zeros(len(tok), np.int8)
        ends = np.cumsum([len(p) - st for p, st in zip(prompts, starts)]) - 1
        out[ends] = 1
        row_seq = {int(e): s for s, e in enumerate(ends)}

        generated: list[list[int]] = [[] for _ in range(B)]
        times: list[list[float]] = [[] for _ in range(B)]
        logits: list[list[np.ndarray]] = [[] for _ in range(B)]
        engine_ttft = [0.0] * B
        done = [False] * B
        eog = L.llama_vocab_is_eog
        # each decode step's positions, [step, sequence] (step k decodes the token chosen at step k - 1),
        # built before the clock starts: an in-place `pos += 1` on the batch cost ~6 us a step
        step_pos = np.add.outer(np.arange(n_tokens + 1, dtype=np.int32),
                                np.asarray([len(p) for p in prompts], np.int32)) - 1

        L.llama_perf_context_reset(self._ctx)
        t0_perf = self._perf_ms()
        start = time.perf_counter()
        for rows, view in self._decode(tok, pos, seq, out):
            if view is None:
                continue
            best = view.argmax(axis=1)
            if keep_logits:
                kept = view.copy()
            now = time.perf_counter()
            eng = (self._perf_ms() - t0_perf) / 1e3
            for j, r in enumerate(rows):
                s = row_seq[int(r)]
                generated[s].append(int(best[j]))
                times[s].append(now)
                engine_ttft[s] = eng
                if keep_logits:
                    logits[s].append(kept[j])
                if (stop_at_eos and eog(self._vocab, int(best[j]))) or limits[s] <= 1:
                    done[s] = True
        # Decode steps: one token per live sequence (at most n_seq_max <= n_batch: one llama_decode call).
        # This loop is the timed path, and on a small model a step takes ~0.1 ms: the batch is written
        # once and then advanced in place (tokens <- argmax, positions <- the step's row of step_pos), and
        # a step only appends its time and its argmax array; who got which token when is sorted out after
        # the clock stops (building arrays per step, as _decode does, cost 20-30% of the throughput on the
        # built-in model; per-sequence list appends, a tolist and `pos += 1` another ~8 us a step).
        batch, ctx = self._batch, self._ctx
        decode, struct, view_of, clock = L.llama_decode, batch.struct, self._logits, time.perf_counter
        live = [s for s in range(B) if not done[s]]
        n = len(live)
        steps: list[tuple[list[int], list[float], list[np.ndarray], list[np.ndarray]]] = []
        if n and n_tokens > 1:
            pos_rows = step_pos if n == B else step_pos[:, live]
            batch.fill([generated[s][-1] for s in live], pos_rows[1], live, 1)
            tok_n, pos_n = batch.token[:n], batch.pos[:n]
            stamps: list[float] = []
            bests: list[np.ndarray] = []
            kepts: list[np.ndarray] = []
            steps.append((live, stamps, bests, kepts))
        for step in range(1, n_tokens):
            if not n:
                break
            rc = decode(ctx, struct)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc} ({'no KV slot' if rc == 1 else 'error'}) for {n} tokens")
            view = view_of(n)
            best = view.argmax(axis=1)
            stamps.append(clock())
            bests.append(best)
            if keep_logits:
                kepts.append(view.copy())
            if (stop_at_eos and any(eog(self._vocab, t) for t in best.tolist())) or step + 1 in stop_steps:
                toks = best.tolist()
                for s, t in zip(live, toks):
                    # every live sequence holds step + 1 tokens now (they go to `generated` after the clock)
                    done[s] = done[s] or (stop_at_eos and bool(eog(self._vocab, t))) or step + 1 >= limits[s]
                live = [s for s in live if not done[s]]
                n = len(live)
                if n:
                    pos_rows = step_pos[:, live]
                    batch.fill([t for s, t in zip(steps[-1][0], toks) if not done[s]], pos_rows[step + 1], live, 1)
                    tok_n, pos_n = batch.token[:n], batch.pos[:n]
                    stamps, bests, kepts = [], [], []
                    steps.append((live, stamps, bests, kepts))
                continue
            tok_n[:] = best
            pos_n[:] = pos_rows[step + 1]
        end = time.perf_counter()
        for seqs, stamps_, bests_, kepts_ in steps:   # each step's tokens and time to their sequences
            toks_by_seq = np.stack(bests_, axis=1).tolist() if bests_ else [[] for _ in seqs]
            for j, s in enumerate(seqs):
                generated[s] += toks_by_seq[j]
                times[s] += stamps_
                if keep_logits:
                    logits[s] += [k[j] for k in kepts_]
        perf = L.llama_perf_context(self._ctx)
        self.last_perf = {"t_p_eval_ms": perf.t_p_eval_ms, "t_eval_ms": perf.t_eval_ms,
                          "n_p_eval": perf.n_p_eval, "n_eval": perf.n_eval, "prefix_reused": list(starts)}
        if self.opts.keep_kv_between_runs:
            # in the cache: the prompt and every generated token but the last (never decoded)
            self._cached = {s: list(prompts[s]) + generated[s][:-1] for s in range(B)}
        return {"start": start, "end": end, "generated": generated, "times": times, "logits": logits,
                "engine_ttft": engine_ttft}
