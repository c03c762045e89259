"""The matrix's `tasks:` section: task sets every cell runs after its timings and logprobs.

    tasks:
      - tiny-lastword                       # a built-in task, by name (BUILTIN_TASKS)
      - {kind: generation, name: qa, path: data/qa.jsonl, metric: exact_match, stop: ["\\n"], max_tokens: 32}
      - {kind: choice, name: mc, path: data/mc.jsonl, metric: acc_norm}
      - {kind: lm_eval, task: my_task, include_path: tasks/, limit: 50}

Item files are JSONL: generation `{prompt, answer}` or `{prompt, answers: [...]}`; choice
`{prompt, choices: [...], answer_index}`, each choice without the `target_delimiter` that joins it to the
prompt (" " by default, as lm-eval's; a file whose every choice starts with it is the old form: read, with
a note). lm-eval tasks are lm-eval's own (a local task YAML with
`dataset_path: json` and `data_files` runs without a network). Files are read and checked by
`bench validate`, before any engine starts; the driver tokenizes every item with the group's
tokenizer (`task_specs`), so every engine of a model scores the same ids.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from adapters.contract.specs import ChoiceTaskSpec, GenerationTaskSpec, LmEvalTaskSpec, TaskSpec
from adapters.contract.tokenizer import Tokenizer
from orchestrator.inputs import lm_eval_tasks

BUILTIN_DIR = Path(__file__).parent / "data" / "tasks"
# binary metrics score 0 or 1 per item (McNemar's test applies); the others are continuous in [0, 1]
GENERATION_METRICS = ("exact_match", "regex_match", "contains", "token_f1", "rouge_l", "chrf", "bleu")
CHOICE_METRICS = ("acc", "acc_norm", "acc_bytes")
BINARY_METRICS = ("exact_match", "regex_match", "contains", "acc", "acc_norm", "acc_bytes")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GenerationTask(_Strict):
    kind: Literal["generation"]
    name: str
    path: str = Field(description="JSONL of {prompt, answer} or {prompt, answers: [...]}")
    metric: Literal[GENERATION_METRICS] = Field("exact_match", description="exact_match, regex_match, contains "
                                                "(after SQuAD-style normalisation), token_f1, rouge_l (rouge-score), "
                                                "chrf, bleu (sacrebleu); the best over an item's answers")
    regex: str | None = Field(None, description="regex_match: the pattern whose match in the prediction is compared")
    regex_pick: Literal["first", "last"] = Field("last", description="regex_match: which match (GSM8K: the last number)")
    stop: list[str] = Field(default_factory=lambda: ["\n"], description="The prediction ends at the first of these")
    max_tokens: int = Field(32, ge=1)
    limit: int | None = Field(None, ge=1, description="Only the first `limit` items")

    @field_validator("regex")
    @classmethod
    def _compiles(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as err:
                raise ValueError(f"not a valid regular expression: {err}") from None
        return v


class ChoiceTask(_Strict):
    kind: Literal["choice"]
    name: str
    path: str = Field(description="JSONL of {prompt, choices: [...], answer_index}, choices without the delimiter")
    metric: Literal[CHOICE_METRICS] = Field("acc", description="acc: the highest summed logprob; acc_norm: per "
                                            "character of the choice's text, acc_bytes: per UTF-8 byte (lm-eval's: "
                                            "the choice alone, without the delimiter)")
    target_delimiter: str = Field(" ", description="What joins the prompt and each choice (lm-eval's "
                                  "target_delimiter): scored with the choice, not counted by acc_norm/acc_bytes")
    limit: int | None = Field(None, ge=1)


class LmEvalTask(_Strict):
    kind: Literal["lm_eval"]
    task: str = Field(description="The lm-eval task name")
    name: str | None = Field(None, description="Default: the task name")
    include_path: str | None = Field(None, description="A folder of lm-eval task YAMLs (local datasets: relative "
                                     "data_files resolve against this folder)")
    num_fewshot: int | None = Field(None, ge=0)
    limit: int | None = Field(None, ge=1)
    metric: str | None = Field(None, description="The per-item metric stored as the score (default: the task's first)")
    max_length: int | None = Field(None, ge=2, description="lm-eval's max_length: the rolling windows' and truncation's "
                                   "length (default: the model's, as lm-eval's HF backend resolves it)")


TaskEntry = Annotated[Union[GenerationTask, ChoiceTask, LmEvalTask], Field(discriminator="kind")]

BUILTIN_TASKS: dict[str, GenerationTask | ChoiceTask] = {
    "tiny-lastword": GenerationTask(kind="generation", name="tiny-lastword", path=str(BUILTIN_DIR / "tiny-lastword.jsonl"),
                                    metric="regex_match", regex=r"\w+", regex_pick="first", stop=["."], max_tokens=4),
    "tiny-continue": GenerationTask(kind="generation", name="tiny-continue", path=str(BUILTIN_DIR / "tiny-continue.jsonl"),
                                    metric="rouge_l", stop=["."], max_tokens=24),
    "tiny-ending": ChoiceTask(kind="choice", name="tiny-ending", path=str(BUILTIN_DIR / "tiny-ending.jsonl")),
}


def task_name(entry: TaskEntry) -> str:
    return entry.name or entry.task if isinstance(entry, LmEvalTask) else entry.name


def resolve(entries: list) -> list[TaskEntry]:
    """The matrix's entries with built-in names replaced by their definitions (checked by `problems`)."""
    return [BUILTIN_TASKS[e] if isinstance(e, str) else e for e in entries]


@dataclass
class Items:
    """One task's items as the driver holds them: the texts, the answers the metrics compare with."""

    prompts: list[str]
    answers: list[list[str]] = field(default_factory=list)      # generation: an item's acceptable answers
    choices: list[list[str]] = field(default_factory=list)      # choice: the choices' texts, without the delimiter
    answer_index: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)              # how the file was read, where it is not plain


def read_items(entry: GenerationTask | ChoiceTask) -> Items:
    """The item file, checked line by line (ValueError: the line and what it lacks)."""
    items = Items(prompts=[])
    with open(entry.path) as f:
        lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
    for n, line in lines[: entry.limit]:
        where = f"line {n} of {entry.path}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not JSON ({err.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise ValueError(f"{where}: expected an object with a string 'prompt'")
        items.prompts.append(row["prompt"])
        if isinstance(entry, GenerationTask):
            answers = row.get("answers", [row["answer"]] if "answer" in row else None)
            if not (isinstance(answers, list) and answers and all(isinstance(a, str) for a in answers)):
                raise ValueError(f"{where}: expected 'answer' (a string) or 'answers' (a list of strings)")
            items.answers.append(answers)
        else:
            choices, k = row.get("choices"), row.get("answer_index")
            if not (isinstance(choices, list) and len(choices) >= 2 and all(isinstance(c, str) and c for c in choices)):
                raise ValueError(f"{where}: expected 'choices', a list of 2 or more non-empty strings")
            if not (isinstance(k, int) and not isinstance(k, bool) and 0 <= k < len(choices)):
                raise ValueError(f"{where}: expected 'answer_index', an index into 'choices'")
            items.choices.append(choices)
            items.answer_index.append(k)
    if not items.prompts:
        raise ValueError(f"{entry.path} holds no items")
    if isinstance(entry, ChoiceTask):
        _strip_old_delimiter(entry, items)
    return items


def _strip_old_delimiter(entry: ChoiceTask, items: Items) -> None:
    """A file of the old form (every choice starts with the delimiter, as the continuation lm-eval scores)
    is read as choices without it, with a note; a file where only some do is read as written, with a note."""
    d = entry.target_delimiter
    if not d:
        return
    starting = sum(c.startswith(d) for cs in items.choices for c in cs)
    total = sum(map(len, items.choices))
    if starting == total:
        if any(c == d for cs in items.choices for c in cs):
            raise ValueError(f"{entry.path}: a choice is only the target_delimiter {d!r}")
        items.choices = [[c[len(d):] for c in cs] for cs in items.choices]
        items.notes.append(f"{entry.path}: every choice starts with the target_delimiter {d!r} (the old form): read "
                           "without it, as lm-eval's choices; write choices without it (or set target_delimiter: '')")
    elif starting:
        items.notes.append(f"{entry.path}: {starting} of {total} choices start with the target_delimiter {d!r}, "
                           f"which is put before each choice again; set target_delimiter: '' if they carry their own")


def problems(entries: list) -> list[str]:
    """What is wrong with the tasks section, as `tasks[i].key: message` lines (bench validate)."""
    out, seen = [], {}
    for i, e in enumerate(entries):
        where = f"tasks[{i}]"
        if isinstance(e, str):
            if e not in BUILTIN_TASKS:
                out.append(f"{where}: unknown built-in task {e!r} (known: {', '.join(BUILTIN_TASKS)}; or a mapping "
                           "with kind: generation | choice | lm_eval)")
                continue
            e = BUILTIN_TASKS[e]
        name = task_name(e)
        if name in seen:
            out.append(f"{where}: a second task named {name!r} (tasks[{seen[name]}]); give one a `name`")
        seen[name] = i
        if isinstance(e, LmEvalTask):
            if e.include_path and not Path(e.include_path).is_dir():
                out.append(f"{where}.include_path: no such folder: {e.include_path}")
            else:
                out += lm_eval_tasks.problems(e.task, e.metric, e.include_path, where)
            continue
        if isinstance(e, GenerationTask) and e.metric == "regex_match" and not e.regex:
            out.append(f"{where}.regex: regex_match needs a pattern")
        if not Path(e.path).is_file():
            out.append(f"{where}.path: no such file: {e.path}")
            continue
        try:
            read_items(e)
        except (ValueError, OSError) as err:
            out.append(f"{where}.path: {err}")
    return out


Loaded = dict[str, tuple[TaskEntry, Items | None]]   # task name -> its entry and items (lm-eval: None)


def notes(entries: list) -> list[str]:
    """How the item files of the tasks section were read, where that needs saying (bench validate)."""
    out = []
    for i, e in enumerate(entries):
        e = BUILTIN_TASKS.get(e) if isinstance(e, str) else e
        if isinstance(e, ChoiceTask) and Path(e.path).is_file():
            try:
                out += [f"tasks[{i}]: {n}" for n in read_items(e).notes]
            except (ValueError, OSError):
                pass   # said by `problems`
    return out


def load_tasks(entries: list) -> Loaded:
    """The matrix's tasks, built-in names resolved and item files read once (lm-eval reads its own)."""
    return {task_name(e): (e, None if isinstance(e, LmEvalTask) else read_items(e)) for e in resolve(entries)}


def task_specs(tasks: Loaded, tok: Tokenizer, tokenizer_source: str, trust_remote_code: bool,
               model_max_length: int | None) -> list[TaskSpec]:
    """The tasks as the engine process gets them: every text as this model's token ids (lm-eval tasks:
    `model_max_length` unless the entry sets its own max_length)."""
    specs: list[TaskSpec] = []
    for e, items in tasks.values():
        if isinstance(e, LmEvalTask):
            include = str(Path(e.include_path).resolve()) if e.include_path else None
            specs.append(LmEvalTaskSpec(name=task_name(e), task=e.task, include_path=include,
                                        num_fewshot=e.num_fewshot, limit=e.limit, metric=e.metric,
                                        tokenizer=tokenizer_source, trust_remote_code=trust_remote_code,
                                        max_length=e.max_length or model_max_length or 2048))
            continue
        if isinstance(e, GenerationTask):   # encoded as lm-eval's HF backend encodes a generation context
            specs.append(GenerationTaskSpec(name=e.name, prompts=[tok.encode_task(p) for p in items.prompts],
                                            max_tokens=e.max_tokens))
        else:   # split as lm-eval's loglikelihood splits (context, delimiter + choice): one number with its twin
            pairs = [[tok.encode_pair(prompt, e.target_delimiter + c) for c in texts]
                     for prompt, texts in zip(items.prompts, items.choices)]
            specs.append(ChoiceTaskSpec(name=e.name, contexts=[[ctx for ctx, _ in item] for item in pairs],
                                        choices=[[cont for _, cont in item] for item in pairs]))
    return specs


def has_lm_eval(tasks: Loaded) -> bool:
    return any(isinstance(e, LmEvalTask) for e, _ in tasks.values())


def longest_sequence(specs: list[TaskSpec]) -> int:
    """The most tokens one engine call of these tasks holds (an lm-eval task: its max_length + 1, the
    longest window lm-eval scores), so the engine's context is sized for them."""
    out = 0
    for t in specs:
        if isinstance(t, LmEvalTaskSpec):
            out = max(out, t.max_length + 1)
        elif isinstance(t, GenerationTaskSpec):
            out = max([out] + [len(p) + t.max_tokens for p in t.prompts])
        else:
            out = max([out] + [len(c) + len(x) for cs, xs in zip(t.contexts, t.choices) for c, x in zip(cs, xs)])
    return out
