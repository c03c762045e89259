"""An engine group as the worker will see it: the job the scheduler hands the launcher (`GroupJob`),
the `GroupSpec` written for the child (prompts, tasks and samples as token ids), the row every cell
starts from, and why a group cannot start in its environment at all.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import adapters
from adapters.contract.arrivals import TraceArrival
from adapters.contract.specs import (
    CellSpec,
    GroupSpec,
    LoadSpec,
    ModelSpec,
    SamplerSettings,
    SamplingSpec,
    ScoringSpec,
    ServeSpec,
)
from orchestrator.execution.engine_child.prompts import Tokenizer, scoring_prompts, text_prompts, timing_requests
from orchestrator.inputs import lm_eval_tasks, task_sets
from orchestrator.inputs.chat import ChatRenderer
from orchestrator.matrix.cells import Cell, EngineGroup, own_schedule, pair_key, stream_schedule
from orchestrator.matrix.models import Matrix, Sampling, Tolerances

# the checkout the engine child imports `adapters` from (its PYTHONPATH), and what rows never show
PROJECT_ROOT = Path(adapters.__file__).resolve().parent.parent


@dataclass
class GroupJob:
    """What a Ray task needs to run one engine group (picklable)."""

    run_id: str
    group: EngineGroup
    matrix: Matrix
    device: str
    python: str
    cache_dir: str
    tries: int = 0          # times the scheduler has sent this group to Ray
    ledger: Any = None      # work stealing (orchestrator/execution/scheduling/ledger.py): the driver's ledger actor, and this part's id
    part_id: str = ""
    board: Any = None       # the driver's progress board (orchestrator/execution/progress.py): PartReports go there
    env_vars: dict[str, str] = field(default_factory=dict)   # the matrix env's variables, in the engine child's environ
    twin: "GroupJob | None" = None   # an env pair: the same cells in another env, run on this node, interleaved
    timing_twin: "GroupJob | None" = None   # measure.paired_timing: the baseline's cells, timed in turns with these
    timing_only: bool = False        # a timing twin: warm-up and timed repeats only (no logprobs, samples, tasks)
    timing_pairs: dict[str, str] = field(default_factory=dict)   # with a timing twin: cell_id -> its baseline's

    def all_cells(self) -> list[Cell]:
        """Its cells and its twin's."""
        return self.group.cells + (self.twin.group.cells if self.twin else [])


def load_kind(m: Matrix, cell: Cell) -> str:
    """batch (an offline static batch), closed (a served closed loop), the arrival of a served rate
    (constant, poisson, gamma), or a schedule of its own (ramp, trace)."""
    if cell.mode == "offline":
        return "batch"
    if cell.mode == "stream":
        return stream_schedule(m, cell.workload, cell.request_rate) or "stream"
    if cell.search:
        return f"search {m.serve.search.variable}"
    own = own_schedule(m, cell.workload)
    if own:
        return own
    return "closed" if math.isinf(cell.request_rate) else m.serve.arrival.kind


def resolve_source(source: str, cache_dir: str) -> str:
    if source.startswith("builtin:"):
        from orchestrator.inputs.tiny_model import resolve_model_source

        return resolve_model_source(source, Path(cache_dir))
    return source


def tokenizer_source(job: GroupJob) -> str:
    entry = job.matrix.model_entry(job.group.model)
    return resolve_source(entry.tokenizer or entry.source, job.cache_dir)


def build_spec(job: GroupJob, cells: list[Cell], tok: Tokenizer, tasks: task_sets.Loaded) -> GroupSpec:
    m, g = job.matrix, job.group
    entry = m.model_entry(g.model)
    source = resolve_source(entry.source, job.cache_dir)
    serve = g.mode == "serve"
    api = adapters.ADAPTERS[g.framework].server_api if serve else None
    as_text = serve and not api.prompt_ids   # a server that takes text only gets the prompts' text
    auto = m.measure.auto_repeats if m.measure.repeats == "auto" else None
    repeats = auto.max_repeats if auto else m.measure.repeats   # prompts are prepared for the most
    # a chat workload: the model's own template renders the messages (NoChatTemplate: unsupported rows)
    chat = ChatRenderer(tokenizer_source(job), entry.trust_remote_code) if is_chat_group(m, cells) else None
    spec_cells, longest = [], 0
    for c in cells:
        per_run = {"serve": m.serve.requests, "stream": m.measure.stream_requests}.get(g.mode, c.batch_size)
        n = m.measure.warmup * c.batch_size + repeats * per_run
        # a drawn or dataset workload: the cell's input_len / output_len cap (datasets) or name (drawn) lengths
        w = m.workload_of(c.workload)
        req = timing_requests(w, tok, n, _cap(w, "input_lengths", c.input_len), _cap(w, "output_lengths", c.output_len),
                              g.mode, chat)
        prompts, texts = req.prompts, None
        if as_text and not getattr(w, "chat", False):
            prompts, texts = text_prompts(tok, prompts)
        outs = req.output_lens or [c.output_len] * len(prompts)
        longest = max([longest] + [len(p) + o for p, o in zip(prompts, outs)])
        spec_cells.append(CellSpec(
            cell_id=c.cell_id, batch_size=c.batch_size, output_len=c.output_len, warmup=m.measure.warmup,
            repeats=repeats, auto=auto, ignore_eos=m.measure.ignore_eos, timing_prompts=prompts, timing_texts=texts,
            timing_messages=req.messages if serve else None,
            request_rate=None if c.request_rate is None or math.isinf(c.request_rate) else c.request_rate,
            output_lens=req.output_lens, follows=req.follows, think_time_s=req.think_time_s,
            stream_requests=per_run if g.mode == "stream" else 0,
            arrival=_cell_arrival(m, c, req.gaps_s),
            notes=([f"workload: {c.workload}"] if c.workload else []) + req.notes))
    if g.mode != "serve":
        partners = timing_partners(m, cells)
        for sc in spec_cells:
            sc.timing_partner = partners.get(sc.cell_id)
    scoring = scoring_prompts(m.measure, tok)
    task_max = lm_eval_tasks.model_max_length(source, tokenizer_source(job)) if task_sets.has_lm_eval(tasks) else None
    task_specs = task_sets.task_specs(tasks, tok, tokenizer_source(job), entry.trust_remote_code, task_max)
    sampling = m.sampling_for(g.framework, g.flags)
    load = LoadSpec(
        framework=g.framework, quantization=g.engine_quantization, options=g.options, device=job.device,
        gpus=0 if job.device == "cpu" else max(1, int(g.options.get("tensor_parallel_size", 1))),
        cache_dir=str(Path(job.cache_dir) / "engines"), seed=0,
        max_running=g.cells[0].batch_size if g.mode == "stream" else None,
        context_len=max([longest, task_sets.longest_sequence(task_specs)] + [m.measure.scoring_len + max(
            m.measure.greedy_tokens, sampling.tokens if sampling else 0)]),
        model=ModelSpec(name=g.model, source=source, trust_remote_code=entry.trust_remote_code, revision=entry.revision))
    return GroupSpec(
        mode=g.mode, load=load, cells=spec_cells,
        scoring=None if serve and not m.serve.capture_logprobs else ScoringSpec(
            prompts=scoring, texts=[tok.decode(p) for p in scoring] if as_text else None,
            top_k=m.measure.top_k, greedy_tokens=m.measure.greedy_tokens, repeats=m.measure.score_repeats),
        serve=None if not serve else ServeSpec(
            **m.serve.model_dump(), endpoint=entry.endpoint, api_key_env=entry.api_key_env,
            # one seed per server (arrivals, request seeds): the first cell's workload's, where workloads differ
            startup_timeout_s=0.95 * m.run.load_timeout_s, seed=getattr(m.workload_of(cells[0].workload), "seed", 0)),
        tasks=task_specs, sampling=_sampling_spec(sampling, scoring, m.tolerances),
        env_name=g.env, env_vars=job.env_vars)


def pair_jobs(jobs: list[GroupJob]) -> list[GroupJob]:
    """Jobs whose groups are the same but for their env become pairs: the first (in the order of axes.env)
    keeps the other as its `twin`, so both run in one Ray task on one node, their timed repeats interleaved.
    Serve groups, and a third env of the same configuration, stay jobs of their own (run one after another)."""
    out, partner = [], {}
    for job in jobs:
        g = job.group
        if g.env is None or g.mode == "serve":
            out.append(job)
            continue
        # sorted by their text: a key holds None beside numbers (a stream at once beside one at a rate)
        key = (g.framework, g.model, g.quantization, g.flags, g.mode, tuple(sorted(map(repr, map(pair_key, g.cells)))))
        first = partner.get(key)
        if first is not None and first.twin is not None:
            out.append(job)
        elif first is None:
            partner[key] = job
            out.append(job)
        else:
            first.twin = job
    return out


def baseline_key(m: Matrix):
    """cell -> the axes of its exact baseline (the matrix's `baseline` selector fixes its axes, the others are the
    cell's own: same batch, lengths, workload, env unless the selector names them)."""
    from orchestrator.matrix.baselines import axis_value   # here: it imports pandas, which a worker never needs

    sel = {a: axis_value(a, v) for a, v in m.baseline.items()}
    return lambda c: tuple(sel.get(a, axis_value(a, v)) for a, v in c.axes().items())


def own_axes(c: Cell) -> tuple:
    from orchestrator.matrix.baselines import axis_value

    return tuple(axis_value(a, v) for a, v in c.axes().items())


def timing_partners(m: Matrix, cells: list[Cell]) -> dict[str, str]:
    """cell_id -> its baseline's cell_id where that baseline is another of these cells (one engine group: a selector
    that fixes a load axis, e.g. batch_size: 1, judges batch 4 against batch 1 of one engine load). Their timed
    repeats take turns in the engine child (adapters/worker/timing_partner.py) unless measure.paired_timing is
    false: it costs the baseline's timed batch once more per repeat, and no engine load."""
    if m.measure.paired_timing is False:
        return {}
    key, owner = baseline_key(m), {own_axes(c): c.cell_id for c in cells}
    return {c.cell_id: b for c in cells if (b := owner.get(key(c))) not in (None, c.cell_id)}


def paired_timing_on(m: Matrix, device: str) -> bool:
    """measure.paired_timing's twins, its null resolved: off (turns inside one engine: timing_partners). A twin costs an
    engine load and the baseline's timed repeats per paired group. On the shared 2-core host (speed-null E-H) it
    called llama.cpp / hf in 8 of 9 runs under a switching load where Welch called none of 3, and on a quiet run
    Welch called it as well; its pairs do not see the difference between two loads of one engine (a false 0.81x between
    two hf processes of the same work). A GPU run would need both engines' memory on one GPU. `true` turns it on."""
    return bool(m.measure.paired_timing)


def timing_twins(jobs: list[GroupJob]) -> list[GroupJob]:
    """measure.paired_timing: each offline or stream job whose cells' baselines (the matrix's `baseline` selector,
    an exact match: same batch, lengths, workload, env) are in another job gets a `timing_twin`: a copy of that
    baseline job with just those cells, timing only, run beside it on one node, each cell's timed repeats taking
    turns with its baseline's (supervisor.Floor). A cell whose baseline is in its own job takes turns inside its
    engine (timing_partners); an env pair, a serve group and a baseline cell wanted twice by one job (a selector
    that fixes a load axis) are left as they are: Welch."""
    if not jobs or not paired_timing_on(jobs[0].matrix, jobs[0].device):
        return jobs
    key = baseline_key(jobs[0].matrix)
    owner = {own_axes(c): (job, c) for job in jobs for c in job.group.cells}
    for job in jobs:
        if job.twin is not None or job.group.mode == "serve":
            continue
        base_job, cells, pairs = None, {}, {}
        for c in job.group.cells:
            j, b = owner.get(key(c), (None, None))
            if j is None or j is job or (base_job is not None and j is not base_job) or b.cell_id in cells \
                    or j.group.mode == "serve":
                continue
            base_job, cells[b.cell_id], pairs[c.cell_id] = j, b, b.cell_id
        if base_job is not None:
            group = dataclasses.replace(base_job.group, cells=list(cells.values()))
            job.timing_twin = dataclasses.replace(base_job, group=group, twin=None, timing_twin=None, timing_only=True)
            job.timing_pairs = pairs
    return jobs


def _cell_arrival(m: Matrix, cell: Cell, gaps_s: list[float] | None):
    """What the worker needs of a cell's arrivals beyond its request_rate: a trace's times (serve and stream),
    or for a stream on a schedule, serve.arrival's shape (a served cell's comes with its group's ServeSpec)."""
    if gaps_s is not None and cell.mode in ("serve", "stream"):
        return TraceArrival(gaps_s=gaps_s)
    if cell.mode == "stream" and stream_schedule(m, cell.workload, cell.request_rate):
        return m.serve.arrival
    return None


def _cap(workload, field: str, axis_value: int) -> int:
    """The most tokens a request may have: a drawn distribution's upper end, else the axis value."""
    dist = getattr(workload, field, None)
    return dist.upper if dist is not None else axis_value


def _sampling_spec(s: Sampling | None, scoring: list[list[int]], tol: Tolerances) -> SamplingSpec | None:
    if s is None:
        return None
    auto = s.auto_seeds if s.seeds == "auto" else None
    # the served test runs at sampling_alpha over the tests run: two where the first-token test has candidates
    level = tol.sampling_alpha / (2 if s.next_top_k else 1)
    return SamplingSpec(prompts=scoring[: s.prompts or len(scoring)], seeds=auto.min_seeds if auto else s.seeds,
                        seed_offset=s.seed_offset, tokens=s.tokens, repeats=s.repeats, next_top_k=s.next_top_k,
                        auto=auto, auto_shift=tol.sampling_shift, auto_level=level,
                        settings=SamplerSettings(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p))


def is_chat_group(m: Matrix, cells: list[Cell]) -> bool:
    """Whether any of these cells runs a chat workload (the model's chat template, /v1/chat/completions)."""
    return any(getattr(m.workload_of(c.workload), "chat", False) for c in cells)


def unsupported_reason(job: GroupJob, python: str) -> str | None:
    """What rules a group out before any process starts: the engine's declared support, the env."""
    cls, g = adapters.ADAPTERS[job.group.framework], job.group
    endpoint = g.mode == "serve" and job.matrix.model_entry(g.model).endpoint
    if g.mode == "serve" and cls.server_api is None:
        return f"{g.framework} has no OpenAI-compatible server to run serve cells with" + (
            f": {cls.no_server_reason}" if cls.no_server_reason else "")
    if g.mode == "serve" and is_chat_group(job.matrix, g.cells) and not cls.server_api.chat:
        return f"{g.framework}'s server is not driven through /v1/chat/completions here (chat workloads: vllm, llamacpp)"
    if g.mode == "stream" and not cls.streams:
        return f"{g.framework} has no stream mode: {cls.no_stream_reason}"
    if endpoint:
        return None   # someone else's server: nothing of the engine runs here
    if g.level and "tensor_types" not in cls.Options.model_fields:
        return (f"{g.framework} runs no per-tensor recipe ({g.quantization}): recipes are llama.cpp tensor type "
                "overrides (llamacpp's tensor_types option)")
    if g.engine_quantization not in cls.quantizations:
        return f"{g.framework} does not run quantization {g.engine_quantization} (it runs: {', '.join(cls.quantizations)})"
    if cls.needs_cuda and job.device != "cuda":
        return f"{g.framework} needs CUDA; this run's device is {job.device}"
    if not Path(python).exists() and shutil.which(python) is None:
        hint = f"; create it with: {cls.install_hint}" if cls.install_hint else ""
        return f"{g.framework} environment not installed: its interpreter (run.python.{g.framework}) does not exist{hint}"
    return None
