"""(e2e: a child process per umask.) Run files are written with the mode a plain open() gives under the process's umask (integrity.plain_mode), so
the group a shared results root lets read it reads every run: no 0600 file left by a temporary file's rename."""

import os
import stat
import subprocess
import sys

from tests.helpers import ROOT

WRITE = """
import os, sys
from pathlib import Path
import pyarrow as pa
from orchestrator.store.run_store import atomic_write_table, atomic_write_text
root = Path(sys.argv[1])
atomic_write_text(root / "manifest.json", "{}", durable=True)
atomic_write_table(pa.table({"x": [1]}), root / "cells" / "part.parquet")
"""


def _modes(root) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*")}


def test_files_and_folders_take_the_umask_s_modes_never_0600(tmp_path):
    for umask, file_mode, dir_mode in ((0o022, 0o644, 0o755), (0o027, 0o640, 0o750), (0o002, 0o664, 0o775)):
        root = tmp_path / f"u{umask:o}"
        root.mkdir()
        proc = subprocess.run([sys.executable, "-c", f"import os; os.umask({umask}); exec({WRITE!r})", str(root)],
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        modes = _modes(root)
        assert modes == {"manifest.json": file_mode, "cells": dir_mode, "cells/part.parquet": file_mode}, \
            {k: oct(v) for k, v in modes.items()}
