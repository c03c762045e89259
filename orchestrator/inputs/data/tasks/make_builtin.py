"""Writes the built-in task sets from the held-out text (eval.txt, never trained on), deterministically:

    python orchestrator/inputs/data/tasks/make_builtin.py

tiny-lastword  generation: a sentence without its last word; the answer is that word
tiny-continue  generation: a sentence's first half; the reference is its second half (ROUGE-L)
tiny-ending    choice: a sentence's first half; its own second half among 3 taken from other sentences
               (choices without the " " that joins them to the prompt: the task's target_delimiter)
"""

import json
import re
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


def sentences() -> list[str]:
    text = (HERE.parent / "eval.txt").read_text().replace("\n", " ")
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if len(s.split()) >= 6]


def halves(s: str) -> tuple[str, str]:
    w = s.split()
    k = len(w) // 2
    return " ".join(w[:k]), " ".join(w[k:])


def write(name: str, rows: list[dict]) -> None:
    (HERE / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def main() -> None:
    sents = sentences()
    write("tiny-lastword", [{"prompt": " ".join(s.rstrip(".!?").split()[:-1]),
                             "answer": s.rstrip(".!?").split()[-1]} for s in sents])
    write("tiny-continue", [{"prompt": halves(s)[0], "answer": halves(s)[1]} for s in sents])
    rng = np.random.default_rng(0)
    rows = []
    for i, s in enumerate(sents):
        ctx, true = halves(s)
        others = [halves(sents[j])[1] for j in rng.permutation(len(sents)) if j != i][:3]
        at = int(rng.integers(4))
        choices = others[:at] + [true] + others[at:]
        rows.append({"prompt": ctx, "choices": choices, "answer_index": at})
    write("tiny-ending", rows)


if __name__ == "__main__":
    main()
