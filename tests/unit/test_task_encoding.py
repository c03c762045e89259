"""The task layer's encoding and aggregation rules against lm-eval's own code (lm-eval 0.4.13, in process):
the native kinds' (context, continuation) split is lm-eval's `loglikelihood` split, task texts get the
special tokens lm-eval's HF backend gives them (the tokenizer's default: BOS where it adds one), generations
decode without special tokens, each aggregation is lm-eval's function, and max_length is lm-eval's.
(The whole path through real engines against lm-eval's evaluator: e2e/test_lm_eval_reference.py.)"""

import json
import math
import shutil

import numpy as np
import pytest

from adapters.contract.specs import JUDGED_AGGREGATIONS
from adapters.contract.tokenizer import Tokenizer
from orchestrator.inputs.lm_eval_tasks import model_max_length, problems
from orchestrator.inputs.task_metrics import AGGREGATIONS, aggregate
from orchestrator.judge.task_stats import paired_change
from tests.helpers import ROOT

PAIRS = [("The old sailor took the morning coach to a mountain to", "wn and watched rivers"),   # mid-word
         ("On the way to a mountain town, the driver ", "stopped so that"),                     # trailing space
         ("We missed an old ferry and had", " to spend the night"),
         ("", "The road to a quiet island"),                                                   # empty context
         ("café", " naïve"), ("a", "b")]


@pytest.fixture(scope="module")
def bos_tokenizer(tiny_model, tmp_path_factory):
    """The tiny model's tokenizer with a post-processor that adds BOS, as Llama's does by default."""
    d = tmp_path_factory.mktemp("bos_tok")
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(tiny_model / name, d / name)
    spec = json.loads((d / "tokenizer.json").read_text())
    spec["post_processor"] = {
        "type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                 {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}}
    (d / "tokenizer.json").write_text(json.dumps(spec))
    return d


def _lm_eval_split(tok: Tokenizer, pairs):
    """What lm-eval's own `loglikelihood` hands its backend, with our tokenizer as the backend's tok_encode
    (lm-eval's HF backend: the tokenizer's default special tokens, none where the text starts with BOS)."""
    from lm_eval.api.instance import Instance
    from lm_eval.api.model import TemplateLM

    seen = []

    class Recorder(TemplateLM):
        eot_token_id = tok.eos_id
        prefix_token_id = tok.prefix_id

        def tok_encode(self, string, add_special_tokens=None, **kw):
            if add_special_tokens is None:
                return tok.encode_task(string)
            return tok.encode_default(string) if add_special_tokens else tok.encode(string)

        def _loglikelihood_tokens(self, requests, **kw):
            seen.extend((ctx, cont) for _, ctx, cont in requests)
            return [(0.0, False)] * len(requests)

        def loglikelihood_rolling(self, requests):
            raise NotImplementedError

        def generate_until(self, requests):
            raise NotImplementedError

    Recorder().loglikelihood([Instance("loglikelihood", {}, p, 0) for p in pairs], disable_tqdm=True)
    return seen


@pytest.mark.parametrize("which", ["tiny", "bos"])
def test_the_native_split_is_lm_evals(tiny_model, bos_tokenizer, which):
    tok = Tokenizer(str(tiny_model if which == "tiny" else bos_tokenizer))
    ours = [tok.encode_pair(c, x) for c, x in PAIRS]
    assert ours == _lm_eval_split(tok, PAIRS)
    # the first pair has a token spanning the boundary: the context keeps its own ids, as lm-eval's
    ctx, cont = ours[0]
    assert ctx == tok.encode_task(PAIRS[0][0]) and ctx + cont != tok.encode_task(PAIRS[0][0]) + tok.encode(PAIRS[0][1])


def test_task_texts_get_the_tokenizers_default_special_tokens(tiny_model, bos_tokenizer):
    from transformers import AutoTokenizer

    for d, adds_bos in ((tiny_model, False), (bos_tokenizer, True)):
        ours, theirs = Tokenizer(str(d)), AutoTokenizer.from_pretrained(str(d))
        for text in ("The old sailor", " a mountain town", "café"):
            assert ours.encode_task(text) == theirs.encode(text), (d, text)
            assert (ours.encode_task(text)[0] == ours.bos_id) == adds_bos
        assert ours.encode_task("<s>The old") == ours.encode("<s>The old")   # BOS already there: not twice
        assert ours.prefix_id == theirs.bos_token_id == 0


def test_generations_decode_without_special_tokens(tiny_model):
    tok = Tokenizer(str(tiny_model))
    ids = tok.encode(" the town")
    assert tok.cut([tok.bos_id] + ids + [tok.eos_id] + tok.encode(" more"), []) == " the town"
    assert tok.cut(ids + tok.encode(". And"), ["."]) == " the town"


def test_the_engine_refuses_what_the_driver_cannot_aggregate():
    assert set(AGGREGATIONS) == set(JUDGED_AGGREGATIONS)


@pytest.mark.parametrize("name", sorted(AGGREGATIONS))
def test_each_aggregation_is_lm_evals(name):
    from lm_eval.api.registry import get_aggregation

    rng = np.random.default_rng(1)
    scores, weights = -rng.uniform(1, 40, 30), rng.integers(1, 20, 30).astype(float)
    items = list(scores) if name in ("mean", "perplexity") else list(zip(scores, weights))
    ours = aggregate(name, scores, None if name in ("mean", "perplexity") else weights)
    assert math.isclose(float(ours), get_aggregation(name)(items), rel_tol=1e-12)


def test_max_length_is_lm_evals(tiny_model):
    from lm_eval.models.utils import resolve_max_length
    from transformers import AutoConfig, AutoTokenizer

    theirs = resolve_max_length(AutoConfig.from_pretrained(tiny_model), AutoTokenizer.from_pretrained(tiny_model))
    assert model_max_length(str(tiny_model), str(tiny_model)) == theirs == 1024
    assert model_max_length("/no/such/model", "/no/such/model") == 2048   # lm-eval's default


def test_validate_refuses_unknown_lm_eval_tasks_and_metrics():
    where, inc = "tasks[1]", str(ROOT / "tests" / "data" / "lm_eval")
    assert problems("tiny_mc", "acc_norm", inc, where) == []
    assert problems("ref_rolling", "bits_per_byte", inc, where) == []
    bad_metric = problems("tiny_mc", "acc_nrm", inc, where)
    assert bad_metric == ["tasks[1].metric: lm-eval task tiny_mc has no metric 'acc_nrm' (it has: acc, acc_norm)"]
    bad_task = problems("tiny_mcc", None, inc, where)
    assert len(bad_task) == 1 and bad_task[0].startswith("tasks[1].task: lm-eval has no task 'tiny_mcc' in ")
    assert "tiny_mc" in bad_task[0] and "ref_rolling" in bad_task[0]
    whole_set = problems("tiny_f1", None, inc, where)   # f1 of (gold, prediction) pairs: no per-item score
    assert len(whole_set) == 1 and "aggregates f1 of tiny_f1 with f1" in whole_set[0], whole_set


def test_a_zero_baseline_resample_does_not_drop_the_ratio():
    """8 items, baseline 0.5: some resamples have a baseline of 0. They leave the ratio's interval (counted);
    only a baseline that scores 0 itself has no ratio."""
    base = np.array([1.0, 0, 0, 1, 0, 1, 0, 1])
    c = paired_change(base, base.copy(), binary=True)
    assert c.ratio == 1.0 and c.ratio_lo == c.ratio_hi == 1.0 and 0 < c.ratio_dropped < 200
    zero = paired_change(np.zeros(8), base, binary=True)
    assert math.isnan(zero.ratio) and math.isnan(zero.ratio_lo)


def test_perplexity_changes_are_judged_by_a_paired_permutation_test():
    rng = np.random.default_rng(2)
    ll, words = -rng.uniform(50, 400, 40), rng.integers(20, 120, 40).astype(float)
    same = paired_change(ll, ll + rng.normal(0, 0.01, 40), False, aggregation="weighted_perplexity",
                         base_weights=words, cell_weights=words, higher_is_better=False)
    assert same.test == "paired-permutation" and same.verdict == "no change"
    worse = paired_change(ll, ll - 0.05 * words, False, aggregation="weighted_perplexity",
                          base_weights=words, cell_weights=words, higher_is_better=False)
    # every document lost loglikelihood: perplexity up by exp(0.05), a regression of every item
    assert worse.verdict == "regressed" and worse.worse == 40 and worse.p_value < 0.001
    assert math.isclose(worse.ratio, math.exp(0.05), rel_tol=1e-9)


def test_acc_norm_divides_by_the_choice_without_the_delimiter(tmp_path, monkeypatch):
    """lm-eval's multiple choice (its own task code, default target_delimiter " "): the request is
    (context, delimiter + choice) and acc_norm/acc_bytes divide by the choice alone; the native kind the same.
    The sums are picked so that dividing by one more character (the delimiter) would pick the other choice."""
    from lm_eval.tasks import TaskManager

    from orchestrator.inputs.task_metrics import choice_pick
    from orchestrator.inputs.task_sets import ChoiceTask

    lm_eval_dir = ROOT / "tests" / "data" / "lm_eval"
    monkeypatch.chdir(lm_eval_dir)   # the YAML's data_files are relative to its folder
    task = TaskManager(include_path=str(lm_eval_dir), include_defaults=False).load(["ref_delim_mc"])
    task = task["tasks"]["ref_delim_mc"]
    doc = {"prompt": "The sea", "choices": ["ab", "abcd"], "answer_index": 1}
    lls = [-2.0, -3.9]   # per character of the choice: -1.0 < -0.975; per character of " " + choice: -0.67 > -0.78
    requests = task.construct_requests(doc, task.doc_to_text(doc), metadata=("ref_delim_mc", 0, 1))
    assert [r.arguments for r in requests] == [("The sea", " ab"), ("The sea", " abcd")]
    assert task.process_results(doc, [(x, False) for x in lls])["acc_norm"] == 1.0
    for metric in ("acc_norm", "acc_bytes"):
        native = ChoiceTask(kind="choice", name="mc", path=str(tmp_path / "mc.jsonl"), metric=metric)
        assert native.target_delimiter == " "
        assert choice_pick(native, [[-1.0, -1.0], [-1.9, -2.0]], doc["choices"]) == 1
        assert choice_pick(native, [[-2.0], [-3.9]], [" " + c for c in doc["choices"]]) == 0   # the old divisor


def _choice_file(path, choices: list[list[str]]):
    path.write_text("".join(json.dumps({"prompt": "The sea", "choices": cs, "answer_index": 0}) + "\n"
                            for cs in choices))
    return str(path)


def test_choice_files_old_and_new_form(tmp_path):
    """Choices without the delimiter are read as written; a file whose every choice starts with it (the old
    form) is read without it, with a note; a file where some do is read as written, with a note; with
    target_delimiter "" nothing is stripped. Either form gives the same continuation ids."""
    from orchestrator.inputs.task_sets import ChoiceTask, notes, read_items

    def entry(path, delimiter=" "):
        return ChoiceTask(kind="choice", name="mc", path=path, target_delimiter=delimiter)

    new = _choice_file(tmp_path / "new.jsonl", [["grey sea.", "old mill."], ["a", "bc"]])
    old = _choice_file(tmp_path / "old.jsonl", [[" grey sea.", " old mill."], [" a", " bc"]])
    mixed = _choice_file(tmp_path / "mixed.jsonl", [[" grey sea.", "old mill."], ["a", "bc"]])
    assert read_items(entry(new)).choices == read_items(entry(old)).choices == [["grey sea.", "old mill."], ["a", "bc"]]
    assert read_items(entry(new)).notes == []
    assert "(the old form): read without it" in read_items(entry(old)).notes[0]
    assert read_items(entry(mixed)).choices[0] == [" grey sea.", "old mill."]
    assert "1 of 4 choices start with the target_delimiter ' '" in read_items(entry(mixed)).notes[0]
    assert read_items(entry(old, "")).choices[0] == [" grey sea.", " old mill."] and not read_items(entry(old, "")).notes
    said = notes([entry(new), entry(old), "tiny-ending"])
    assert len(said) == 1 and said[0].startswith("tasks[1]: ")
    only_delimiter = _choice_file(tmp_path / "bad.jsonl", [[" ", " b"]])
    with pytest.raises(ValueError, match="only the target_delimiter"):
        read_items(entry(only_delimiter))


def test_old_and_new_choice_files_score_the_same_ids(tiny_model, tmp_path):
    from orchestrator.inputs.task_sets import ChoiceTask, load_tasks, task_specs

    tok = Tokenizer(str(tiny_model))
    texts = [["grey sea.", "old mill."], ["a", "bc"]]
    specs = []
    for name, cs in (("new", texts), ("old", [[" " + c for c in item] for item in texts])):
        path = _choice_file(tmp_path / f"{name}.jsonl", cs)
        tasks = load_tasks([ChoiceTask(kind="choice", name=name, path=path)])
        specs += task_specs(tasks, tok, str(tiny_model), False, None)
    assert specs[0].contexts == specs[1].contexts and specs[0].choices == specs[1].choices
    assert specs[0].choices[0][0] == tok.encode_pair("The sea", " grey sea.")[1]
