"""The built-in tiny model: a small Llama (or Qwen2) trained in seconds on shipped text.

It lets every engine be exercised end to end without downloading anything. The build is seeded and
runs on one thread, so one machine always gets the same bytes; another CPU (another instruction set
for torch's kernels, another torch) may get other bytes from the same recipe (measured: loglikelihoods
2.5e-3 apart). So a built model is named by both: `<name>-<recipe>-<content>`, the recipe's fingerprint
(`fingerprint`: the builder's version, its training text, the architecture, the chat template) and a
digest of the files the build wrote (`content_digest`: weights, config, tokenizer). `resolve_builtin`
finds a build of the recipe in the cache by its folder name, or builds one; two hosts that built other
bytes give two names, never one name for both.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path

BUILTIN = {"tiny": "llama", "tiny-qwen2": "qwen2"}
# Bump whenever the build changes what it writes: it is part of the cache fingerprint.
# tiny-2: tokenizer_config.json carries CHAT_TEMPLATE (the weights are the same as tiny-1's).
BUILD_VERSION = "tiny-2"

DATA_DIR = Path(__file__).parent / "data"
VOCAB_SIZE = 512
BOS, EOS, PAD = "<s>", "</s>", "<pad>"
ROPE_THETA = 10000.0

# Training recipe. One fixed thread: float reductions can differ with the thread split, and on a
# small busy machine extra OpenMP threads mostly spin (measured: 1 thread was faster than 2).
SEED = 0
THREADS = 1
SEQ_LEN = 128
BATCH = 12
STEPS = 200
LR = 5e-3

# A ChatML-style chat template for chat workloads. The markers are plain text (the byte-level BPE encodes
# any bytes), and a turn ends with EOS, which the model learned to emit after a paragraph, so a served
# reply can stop by itself. Not byte-equal to llama-cpp-python's built-in "chatml" template, so its
# server renders this one (from the GGUF's tokenizer.chat_template) rather than its own.
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
                 "+ eos_token + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                 "{% endif %}")


def corpus_text() -> str:
    return (DATA_DIR / "corpus.txt").read_text(encoding="utf-8")


def eval_text() -> str:
    return (DATA_DIR / "eval.txt").read_text(encoding="utf-8")


def _paragraphs(text: str) -> list[str]:
    return [p.strip() for p in text.split("\n\n") if p.strip()]


# --- tokenizer -----------------------------------------------------------------------------


def train_tokenizer():
    """Byte-level BPE with merges, no post-processor template: encoding adds no BOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[BOS, EOS, PAD],  # ids 0, 1, 2
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable
        show_progress=False,
    )
    tok.train_from_iterator(_paragraphs(corpus_text()), trainer=trainer)
    return tok


def _save_tokenizer(tok, out_dir: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, model_max_length=1024
    )
    fast.save_pretrained(out_dir)
    # transformers writes an (empty) TemplateProcessing post-processor; keep tokenizer.json the
    # plain trained tokenizer instead, so no reader can ever add BOS/EOS on encode.
    tok.save(str(out_dir / "tokenizer.json"))
    # transformers 5 names its own "TokenizersBackend" class; engines may pin transformers 4,
    # which knows only PreTrainedTokenizerFast (5 still maps that name to the same class).
    _write_json(
        out_dir / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS,
            "eos_token": EOS,
            "pad_token": PAD,
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,  # decode must give back the exact text
            "model_max_length": 1024,
            "chat_template": CHAT_TEMPLATE,
        },
    )


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


# --- model ---------------------------------------------------------------------------------


def _config(arch: str, bos: int, eos: int, pad: int):
    common = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,  # vLLM's CPU attention only supports head sizes like 64, not 16
        max_position_embeddings=1024,
        rope_theta=ROPE_THETA,
        rms_norm_eps=1e-5,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        dtype="float32",
    )
    if arch == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(tie_word_embeddings=False, **common)
    if arch == "qwen2":
        from transformers import Qwen2Config

        # Qwen2 always has q/k/v bias; tied embeddings as in the small Qwen2 checkpoints.
        return Qwen2Config(tie_word_embeddings=True, **common)
    raise ValueError(f"unknown arch {arch!r}; known: llama, qwen2")


def _token_stream(tok, text: str, bos: int, eos: int) -> list[int]:
    """Each paragraph as a document: <s> text </s>, so the model also learns to stop."""
    ids: list[int] = []
    for p in _paragraphs(text):
        ids += [bos, *tok.encode(p).ids, eos]
    return ids


@contextlib.contextmanager
def _fixed_threads(n: int):
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _train(model, data, steps: int) -> None:
    import torch

    gen = torch.Generator().manual_seed(SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(  # short warmup, then cosine to ~0
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / steps))
    )
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(data) - SEQ_LEN, (BATCH,), generator=gen)
        batch = torch.stack([data[s : s + SEQ_LEN] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss  # the model shifts labels itself
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    model.eval()


def build_tiny_model(out_dir: Path, arch: str = "llama", seed: int | None = None) -> Path:
    """Train the tokenizer and model and write an HF checkpoint (float32 safetensors) to out_dir.
    Another `seed` gives another model of the same shape (the built-in one uses SEED)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer()
    bos, eos, pad = (tok.token_to_id(t) for t in (BOS, EOS, PAD))
    config = _config(arch, bos, eos, pad)

    with _fixed_threads(THREADS), torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED if seed is None else seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        data = torch.tensor(_token_stream(tok, corpus_text(), bos, eos), dtype=torch.long)
        _train(model, data, STEPS)

    model.generation_config = GenerationConfig(bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)
    model.save_pretrained(out_dir, safe_serialization=True)
    _save_tokenizer(tok, out_dir)

    # transformers 5 writes dtype and rope_parameters; older readers (transformers 4, GGUF
    # converters) look for torch_dtype and a top-level rope_theta.
    cfg_path = out_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["dtype"] = cfg["torch_dtype"] = "float32"
    cfg["rope_theta"] = ROPE_THETA
    _write_json(cfg_path, cfg)

    # save_pretrained may create 0600 files; a shared cache must be readable by other users.
    out_dir.chmod(0o755)
    for f in out_dir.iterdir():
        f.chmod(0o644)
    return out_dir


def perplexity(model_dir: Path, text: str | None = None, window: int = 256) -> float:
    """Perplexity of the saved model on `text` (default: the held-out eval text)."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    ids = torch.tensor(_token_stream(tok, eval_text() if text is None else text, bos, eos))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    nll, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(ids) - 1, window):
            chunk = ids[i : i + window + 1]
            logits = model(input_ids=chunk[None, :-1]).logits[0]
            nll += torch.nn.functional.cross_entropy(logits, chunk[1:], reduction="sum").item()
            count += len(chunk) - 1
    return math.exp(nll / count)


# --- cache ---------------------------------------------------------------------------------


def default_cache_root() -> Path:
    env = os.environ.get("LOSSLESS_BENCH_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "lossless-bench"


def fingerprint(arch: str) -> str:
    """The recipe's fingerprint: what the build is asked to do (not what this CPU made of it)."""
    h = hashlib.sha256()
    for part in (BUILD_VERSION.encode(), (DATA_DIR / "corpus.txt").read_bytes(), arch.encode(), CHAT_TEMPLATE.encode()):
        h.update(len(part).to_bytes(8, "little") + part)
    return h.hexdigest()[:12]


def content_digest(model_dir: Path) -> str:
    """A digest of every file a build wrote (names and bytes): the part of the name that says which bytes."""
    h = hashlib.sha256()
    for f in sorted(p for p in Path(model_dir).iterdir() if p.is_file()):
        for part in (f.name.encode(), f.read_bytes()):
            h.update(len(part).to_bytes(8, "little") + part)
    return h.hexdigest()[:12]


_DIGEST = re.compile(r"[0-9a-f]{12}")


def _built(models: Path, recipe: str) -> Path | None:
    """A finished build of `recipe` in the cache (`<recipe>-<content digest>`): the first by name where a
    shared cache holds several (each named by its own bytes)."""
    done = sorted(p for p in models.glob(f"{recipe}-*") if _DIGEST.fullmatch(p.name[len(recipe) + 1:])
                  and (p / "model.safetensors").exists())
    return done[0] if done else None


def resolve_builtin(name: str, cache_root: Path | None = None) -> Path:
    """The cached checkpoint dir of builtin `name` (`<name>-<recipe fingerprint>-<content digest>`), built on
    first use (once, across processes)."""
    if name not in BUILTIN:
        raise ValueError(f"unknown builtin model {name!r}; known: {', '.join(sorted(BUILTIN))}")
    arch = BUILTIN[name]
    models = Path(cache_root if cache_root is not None else default_cache_root()) / "models"
    recipe = f"{name}-{fingerprint(arch)}"
    found = _built(models, recipe) if models.is_dir() else None
    if found:
        return found
    models.mkdir(parents=True, exist_ok=True)
    with open(models / f"{recipe}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second builder waits here, then finds it built
        found = _built(models, recipe)
        if found:
            return found
        tmp = Path(tempfile.mkdtemp(prefix=f".{recipe}.", dir=models))
        try:
            build_tiny_model(tmp, arch)
            final = models / f"{recipe}-{content_digest(tmp)}"
            if (final / "model.safetensors").exists():   # the same bytes, built meanwhile (a cache shared by hosts)
                shutil.rmtree(tmp)
            else:
                os.replace(tmp, final)  # atomic: readers never see a half-written dir
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def resolve_model_source(source: str, cache_root: Path | None = None) -> str:
    """`builtin:<name>` -> the built checkpoint's path; any other source unchanged."""
    if source.startswith("builtin:"):
        return str(resolve_builtin(source.removeprefix("builtin:"), cache_root))
    return source
