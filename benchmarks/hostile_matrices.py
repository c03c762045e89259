"""Hostile matrices, as a user's `bench validate` meets them: every one refused clearly, quickly and small.

Issue 41's holdout was 94 hostile matrices; this is our own set of the same classes (and more), each written to a
file and given to `bench validate FILE` in a child process of its own, as a user runs it. A case is *refused
clearly* when the child exits 2, its stderr starts `error:` and holds one line per problem (at most 3 problems, each
at most 400 characters, none a traceback), and each problem line names where it is: a YAML path
(`axes.batch_size[0]: ...`), a `(yaml) line L, column C` or the file itself. Per case the wall time (the child's
Python start and imports included, about 1 s of it) and the child's peak memory (VmHWM from /proc/self/status,
not ru_maxrss, which Linux carries over from the parent) are measured; the targets are 5 s and 300 MB.

    python benchmarks/hostile_matrices.py            # every case (100+), about 2 minutes on 2 cores
    python benchmarks/hostile_matrices.py --quick    # CI: one case of each class

Classes: sizes (every bounded integer past its bound, negative, zero where 0 is meaningless), types (`true`
for an int, text, floats, lists for scalars), duplicate keys at every depth, paths (traversal, devices, /proc,
pipes, folders as files, missing relative paths, a relative or missing run.python), nesting (deep flow and block
nesting, an alias bomb), encodings (latin-1, UTF-16, NUL, a lone surrogate), YAML syntax (unclosed flows, tabs,
python tags, two documents, empty), cell-count bombs (10^6 to 10^12 combinations), unknown names (keys, axes,
frameworks, flag sets, baselines), the matrix file itself (a folder, a pipe, /dev/zero, 11 MB, a 5000-character
name, missing) and odd values (NaN and infinite tolerances, control characters, very long names).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT_S, LIMIT_MB = 5.0, 300
HEAD = "name: hostile\nmodels: {t: builtin:tiny}\n"
AXES = "axes: {framework: [hf], model: [t]}\n"


def _axes(**extra) -> str:
    items = ", ".join(f"{k}: {v}" for k, v in {"framework": "[hf]", "model": "[t]", **extra}.items())
    return HEAD + f"axes: {{{items}}}\n"


def _block(section: str, **fields) -> str:
    return HEAD + AXES + f"{section}: {{{', '.join(f'{k}: {v}' for k, v in fields.items())}}}\n"


def cases(tmp: Path) -> list[tuple[str, str, object]]:
    """(class, name, matrix): the matrix is the file's text, its bytes, or a path given as it is."""
    out: list[tuple[str, str, object]] = []

    def add(cls: str, name: str, matrix) -> None:
        out.append((cls, name, matrix))

    for axis, values in (("batch_size", ["0", "-1", "65537", "1000000000", "1" + "0" * 32]),
                         ("input_len", ["0", "-5", "1000000000"]), ("output_len", ["0", "1000000000"])):
        for v in values:
            add("sizes", f"{axis} {v[:12]}", _axes(**{axis: f"[{v}]"}))
    for field, v in (("repeats", "10000000"), ("repeats", "0"), ("warmup", "10000000"), ("top_k", "10000000"),
                     ("scoring_prompts", "1000000"), ("scoring_len", "1000000000"), ("greedy_tokens", "1000000000"),
                     ("stream_requests", "1000000000"), ("score_repeats", "0"), ("warmup", "-1")):
        add("sizes", f"measure.{field} {v}", _block("measure", **{field: v}))
    for v in ("-1", "4294967296", "1" + "0" * 30):
        add("sizes", f"workload.seed {v[:12]}", _block("workload", seed=v))
    add("sizes", "integer past 2**53", _axes(batch_size="[9007199254740993]"))

    for axis, v in (("batch_size", "[true]"), ("batch_size", "['4']"), ("batch_size", "[1.5]"), ("batch_size", "4"),
                    ("input_len", "[[16]]"), ("output_len", "[{a: 1}]"), ("framework", "hf"), ("model", "[1]")):
        add("types", f"{axis} {v}", _axes(**{axis: v}))
    add("types", "measure is a list", HEAD + AXES + "measure: [1, 2]\n")
    add("types", "models is a string", "name: x\nmodels: builtin:tiny\n" + AXES)
    add("types", "repeats true", _block("measure", repeats="true"))

    add("duplicate keys", "top level", HEAD + AXES + AXES)
    add("duplicate keys", "in models", "name: x\nmodels: {t: builtin:tiny, t: ../../etc}\n" + AXES)
    add("duplicate keys", "in a model entry", "name: x\nmodels: {t: {source: builtin:tiny, source: /etc}}\n" + AXES)
    add("duplicate keys", "in a flag set", HEAD + AXES + "flags: {hf: {a: {x: 1}, a: {y: 2}}}\n")
    add("duplicate keys", "depth 4, block style", HEAD + AXES + "flags:\n  hf:\n    a:\n      x: 1\n      x: 2\n")
    add("duplicate keys", "name twice", HEAD + AXES + "name: again\n")

    folder = tmp / "folder"
    folder.mkdir()
    fifo = tmp / "pipe"
    os.mkfifo(fifo)
    (tmp / "etc").mkdir()
    for name, source in (("traversal", "../../etc"), ("/etc", "/etc"), ("/etc/passwd", "/etc/passwd"),
                         ("/dev/zero", "/dev/zero"), ("/proc/self/mem", "/proc/self/mem"), ("a pipe", str(fifo)),
                         ("an empty folder", str(folder)), ("missing relative", "no/such/model"),
                         ("5000-character path", "m" * 5000), ("home variable", "${HOME}/model")):
        add("paths", f"model {name}", f"name: x\nmodels: {{t: '{source}'}}\n" + AXES)
    add("paths", "tokenizer /dev/null", "name: x\nmodels: {t: {source: builtin:tiny, tokenizer: /dev/null}}\n" + AXES)
    add("paths", "scoring_text /dev/zero", _block("measure", scoring_text="/dev/zero"))
    add("paths", "scoring_text /proc/cpuinfo", _block("measure", scoring_text="/proc/cpuinfo"))
    add("paths", "scoring_text a pipe", _block("measure", scoring_text=f"'{fifo}'"))
    add("paths", "scoring_text a folder", _block("measure", scoring_text=f"'{folder}'"))
    add("paths", "run.python missing relative", HEAD + AXES + "run: {python: {hf: venv/bin/python}}\n")
    add("paths", "run.python a folder", HEAD + AXES + f"run: {{python: {{hf: '{folder}'}}}}\n")
    add("paths", "run.python /dev/null", HEAD + AXES + "run: {python: {hf: /dev/null}}\n")
    add("paths", "workload file /dev/zero", HEAD + AXES + "workload: {kind: jsonl, path: /dev/zero, field: text}\n")

    add("nesting", "5000-deep flow list", "a: " + "[" * 5000 + "]" * 5000 + "\n")
    add("nesting", "5000-deep flow map", "a: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n")
    add("nesting", "500-deep block map", "".join("  " * i + f"k{i}:\n" for i in range(500)) + "  " * 500 + "v\n")
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))
    add("nesting", "alias bomb (9^9)", HEAD + AXES + bomb)

    add("encodings", "latin-1 byte", ("name: caf\xe9\n" + HEAD.split("\n", 1)[1] + AXES).encode("latin-1"))
    add("encodings", "UTF-16 with BOM", (HEAD + AXES).encode("utf-16"))
    add("encodings", "NUL byte", (HEAD + AXES).encode() + b"\x00\n")
    add("encodings", "lone surrogate bytes", b"name: \xed\xa0\x80\n" + (HEAD + AXES).split("\n", 1)[1].encode())
    add("encodings", "control characters", HEAD + AXES.replace("hf", "h\x07f"))

    add("syntax", "unclosed flow list", HEAD + "axes: {framework: [hf, model: [t]\n")
    add("syntax", "unclosed flow map", HEAD + "axes: {framework: [hf], model: [t]\n")
    add("syntax", "tab indentation", HEAD + "axes:\n\tframework: [hf]\n")
    add("syntax", "bad indentation", HEAD + "axes:\n  framework: [hf]\n model: [t]\n")
    add("syntax", "python tag", HEAD + AXES + "x: !!python/object/apply:os.system ['true']\n")
    add("syntax", "two documents", HEAD + AXES + "---\nname: second\n")
    add("syntax", "empty file", "")
    add("syntax", "only a comment", "# nothing\n")
    add("syntax", "a list at the top", "- name: x\n")
    add("syntax", "a scalar at the top", "hello\n")
    add("syntax", "unterminated string", HEAD + "axes: {framework: ['hf], model: [t]}\n")
    add("syntax", "undefined alias", HEAD + AXES + "x: *nowhere\n")

    for n, per_axis in (("10^6", 100), ("10^9", 1000)):
        values = ", ".join(str(i) for i in range(1, per_axis + 1))
        add("cell bombs", f"{n} cells", _axes(batch_size=f"[{values}]", input_len=f"[{values}]", output_len=f"[{values}]"))
    values = ", ".join(str(i) for i in range(1, 1001))
    add("cell bombs", "10^12 cells", _axes(batch_size=f"[{values}]", input_len=f"[{values}]", output_len=f"[{values}]",
                                           flags="[" + ", ".join(["default"] * 1000) + "]"))
    add("cell bombs", "100,001 includes", HEAD + AXES + "include:\n" + "  - {framework: hf, batch_size: 2}\n" * 100001)

    add("unknown names", "unknown top-level key", HEAD + AXES + "axis: {}\n")
    add("unknown names", "unknown axis", _axes(colour="[red]"))
    add("unknown names", "unknown framework", _axes(framework="[tensorflow]"))
    add("unknown names", "unknown model name", _axes(model="[nope]"))
    add("unknown names", "unknown flag set", _axes(flags="[turbo]"))
    add("unknown names", "baseline of nothing", HEAD + AXES + "baseline: {framework: vllm, quantization: fp4}\n")
    add("unknown names", "unknown measure field", _block("measure", repeat=3))
    add("unknown names", "unknown quantization", _axes(quantization="[q3_zz]"))
    add("unknown names", "unknown mode", _axes(mode="[batch]"))
    add("unknown names", "unknown workload kind", _block("workload", kind="csv"))

    add("the file", "a folder", folder)
    add("the file", "a pipe", fifo)
    add("the file", "/dev/zero", Path("/dev/zero"))
    add("the file", "/proc/self/status", Path("/proc/self/status"))
    add("the file", "11 MB", HEAD + AXES + "#" * (11 * 2**20) + "\n")
    add("the file", "5000-character name", tmp / ("x" * 5000 + ".yaml"))
    add("the file", "missing", tmp / "missing.yaml")

    for field, v in (("kl_lossless", ".nan"), ("kl_near", ".inf"), ("atol", "-1"), ("task_alpha", "1.5"),
                     ("speed_tolerance", "-0.1"), ("noise_factor", ".nan")):
        add("odd values", f"tolerances.{field} {v}", _block("tolerances", **{field: v}))
    add("odd values", "a 100,000-character name", "name: " + "n" * 100000 + "\n" + HEAD.split("\n", 1)[1] + AXES)
    add("odd values", "an empty axis", _axes(batch_size="[]"))
    add("odd values", "a null axis", _axes(batch_size="null"))
    add("odd values", "an empty name", "name: ''\n" + HEAD.split("\n", 1)[1] + AXES)
    add("odd values", "secrets in env", HEAD + AXES + "envs: {a: {vars: {HF_TOKEN: 1}}}\n")
    return out


_PEAK = ("import atexit, sys\n"
         "atexit.register(lambda: print('VMHWM', [l.split()[1] for l in open('/proc/self/status') "
         "if l.startswith('VmHWM:')][0], file=sys.stderr))\n"
         "sys.argv = ['bench', 'validate', sys.argv[1]]\n"
         "from orchestrator.cli import app\napp()\n")
_WHERE = re.compile(r"^\s*(\(yaml\)|\(file\)|\(top level\)|[A-Za-z_][\w.\[\]'-]*:)")


def run_case(path: Path) -> dict:
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _PEAK, str(path)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "1000"}, timeout=60, errors="replace")
    took = time.monotonic() - began
    lines = [x for x in proc.stderr.splitlines() if not x.startswith("VMHWM ")]
    peak = next((int(x.split()[1]) // 1024 for x in proc.stderr.splitlines() if x.startswith("VMHWM ")), None)
    problems = lines[1:]
    clear = (proc.returncode == 2 and bool(lines) and lines[0].startswith("error:") and "Traceback" not in proc.stderr
             and 1 <= len(problems) <= 3 and all(len(p) <= 400 and _WHERE.match(p) for p in problems))
    return {"rc": proc.returncode, "s": took, "mb": peak, "clear": clear, "said": lines}


def _write(tmp: Path, i: int, matrix) -> Path:
    if isinstance(matrix, Path):
        return matrix
    path = tmp / f"case-{i:03d}.yaml"
    path.write_bytes(matrix if isinstance(matrix, bytes) else matrix.encode())
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one case of each class (CI)")
    ap.add_argument("--show", action="store_true", help="print what each case said")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="hostile-") as d:
        tmp = Path(d)
        todo = cases(tmp)
        if args.quick:
            todo = [c for i, c in enumerate(todo) if c[0] not in {x[0] for x in todo[:i]}]
        results = []
        for i, (cls, name, matrix) in enumerate(todo):
            r = run_case(_write(tmp, i, matrix))
            results.append((cls, name, r))
            if args.show or not r["clear"]:
                print(f"{'ok ' if r['clear'] else 'BAD'} {cls:14} {name:34} rc {r['rc']} {r['s']:.2f} s {r['mb']} MB | "
                      + " / ".join(r["said"])[:300])
    clear = sum(r["clear"] for *_, r in results)
    slowest = max(results, key=lambda x: x[2]["s"])
    largest = max(results, key=lambda x: x[2]["mb"] or 0)
    print(f"\n{len(results)} hostile matrices in {len({c for c, *_ in results})} classes, each `bench validate FILE` "
          f"in a child process")
    print(f"refused clearly: {clear} of {len(results)}")
    print(f"slowest: {slowest[2]['s']:.2f} s ({slowest[0]}: {slowest[1]}); largest peak: {largest[2]['mb']} MB "
          f"({largest[0]}: {largest[1]}); targets {LIMIT_S:g} s, {LIMIT_MB} MB")
    ok = clear == len(results) and slowest[2]["s"] < LIMIT_S and (largest[2]["mb"] or 0) < LIMIT_MB
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
