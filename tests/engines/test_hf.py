"""The transformers adapter in process on the tiny model (no Ray, no worker child): full-vocabulary
logprobs sum to one and batching changes no greedy token; the per-token clock of generate's streamer.
(The same adapter through `bench run`: e2e/test_run.py.)"""

import numpy as np


def test_full_vocabulary_logprobs_sum_to_one(tiny_model):
    from adapters.contract.specs import LoadSpec, ModelSpec
    from adapters.engines.hf.adapter import HfAdapter

    adapter = HfAdapter()
    adapter.load(LoadSpec(framework="hf", model=ModelSpec(name="tiny", source=str(tiny_model)), quantization="fp32", device="cpu"))
    vocab = adapter.model.config.vocab_size
    prompts = [[5, 17, 99, 250, 3, 42, 7], [8, 9, 10, 11, 12, 13, 14]]
    for scores in adapter.score(prompts, top_k=vocab) + adapter.greedy(prompts, 4, top_k=vocab):
        total = np.exp(scores.topk_logprobs.astype(np.float64)).sum(axis=1)
        assert np.abs(total - 1).max() < 1e-5
    # the batch changes nothing a user could see: greedy tokens equal at batch 1 and 2
    together = adapter.greedy(prompts, 4, top_k=1)
    alone = [adapter.greedy([p], 4, top_k=1)[0] for p in prompts]
    for a, b in zip(together, alone):
        assert (a.token_ids == b.token_ids).all()
    adapter.close()


def test_hf_step_clock_stamps_each_generated_token_inside_the_call(tiny_model):
    """hf's per-token times come from generate's streamer (one put per step, after the prompt's): one
    stamp per new token, in order, between the call's start and end; with EOS on, as many as the tokens
    up to and including the EOS."""
    from adapters.contract.specs import LoadSpec, ModelSpec
    from adapters.engines.hf.adapter import HfAdapter

    adapter = HfAdapter()
    adapter.load(LoadSpec(framework="hf", model=ModelSpec(name="tiny", source=str(tiny_model)), quantization="fp32",
                          options={}, device="cpu"))
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [13] * 7]
    run = adapter.generate(prompts, 9, ignore_eos=True)
    for req in run.requests:
        assert req.output_tokens == len(req.chunk_times) == 9
        assert run.start < req.chunk_times[0] and all(np.diff(req.chunk_times) >= 0) and req.chunk_times[-1] <= run.end
    # the steps' stamps are shared by the batch's requests (a static batch chooses its tokens together)
    assert run.requests[0].chunk_times == run.requests[1].chunk_times
    # with EOS on: the tokens up to the first EOS, one stamp each (the third step's logits pushed to EOS)
    eos = adapter.gen_eos.eos_token_id
    calls = []

    def eos_from_step_3(module, inputs, logits):
        calls.append(1)
        if len(calls) >= 3:
            logits[..., eos] += 1e4
        return logits

    hook = adapter.model.lm_head.register_forward_hook(eos_from_step_3)
    try:
        run = adapter.generate(prompts, 9, ignore_eos=False)
    finally:
        hook.remove()
    assert [(r.output_tokens, len(r.chunk_times)) for r in run.requests] == [(3, 3)] * 3
