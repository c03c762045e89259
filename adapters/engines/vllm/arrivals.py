"""A stream of requests handed to vLLM's offline engine on an arrival schedule (stream cells with a
request rate, a ramp or a trace), rather than all at once as `LLM.generate` does.

`LLM.generate` adds every request and then steps the engine until all finish (`_run_engine`). Here the
same engine is stepped by hand (`LLMEngine.add_request` / `step`, vLLM's own offline-engine example) and
each request is added at the first step boundary after its arrival time: with the engine busy, a
request can wait for the step in flight to return (milliseconds on the tiny model), and that wait is
measured (sent - scheduled: the row's queue figures), never hidden. With nothing running, the loop
sleeps until the next arrival.
"""

from __future__ import annotations

import time


def run_arriving(llm, prompts: list[list[int]], params, offsets_s: list[float], start: float) -> tuple[list, list[float]]:
    """Each prompt added to `llm`'s engine at start + offsets_s[i] (perf_counter seconds), the engine
    stepped until every request finished. Returns the final outputs in prompt order and when each
    request was handed to the engine."""
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    engine = llm.llm_engine
    per_request = params if isinstance(params, list) else [params] * len(prompts)
    ids = [f"arrival-{i}" for i in range(len(prompts))]
    sent: list[float] = [0.0] * len(prompts)
    done: dict[str, object] = {}
    nxt = 0
    while nxt < len(prompts) or engine.has_unfinished_requests():
        now = time.perf_counter()
        while nxt < len(prompts) and start + offsets_s[nxt] <= now:
            p = per_request[nxt].clone()
            p.output_kind = RequestOutputKind.FINAL_ONLY   # as LLM.generate asks: no output per step
            engine.add_request(ids[nxt], TokensPrompt(prompt_token_ids=list(map(int, prompts[nxt]))), p)
            sent[nxt] = time.perf_counter()
            nxt += 1
            now = time.perf_counter()
        if engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = out
        elif nxt < len(prompts):
            time.sleep(max(0.0, start + offsets_s[nxt] - time.perf_counter()))
    missing = [i for i in ids if i not in done]
    if missing:
        raise RuntimeError(f"vLLM finished without {len(missing)} of {len(ids)} requests (first: {missing[0]})")
    return [done[i] for i in ids], sent
