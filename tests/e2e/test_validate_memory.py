"""`bench validate` of a 10^9-cell matrix (issue 41): refused before expansion, in a child process of its own
so its peak memory is the validation's alone. The peak is the child's VmHWM (/proc/self/status), not
getrusage's ru_maxrss: Linux carries ru_maxrss across fork and exec, so a child of a large pytest process
reports the parent's size (measured: 305 MB there, 49 MB from a shell)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tests.helpers import ROOT
from tests.unit.test_validate_fuzz import HOSTILE


def test_a_billion_cell_matrix_is_refused_in_a_child_under_300_mb(tmp_path):
    """Peak memory (VmHWM of a child that only validates) of refusing a 10^9-cell matrix."""
    path = tmp_path / "huge.yaml"
    path.write_text(dict((c[0], c[1]) for c in HOSTILE)["10^9 cells"])
    code = ("import sys\nfrom orchestrator.matrix.validate import load_matrix\n"
            "from orchestrator.matrix.models import MatrixError\n"
            "try:\n    load_matrix(sys.argv[1])\nexcept MatrixError as e:\n    print(e.problems[0])\n"
            "print([ln.split()[1] for ln in open('/proc/self/status') if ln.startswith('VmHWM:')][0])\n")
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.splitlines()
    assert time.monotonic() - started < 20   # the child's imports included
    assert "1,000,000,000 combinations" in out[0] and "BENCH_MAX_CELLS" in out[0], out
    assert int(out[1]) < 300 * 1024, f"peak {int(out[1]) // 1024} MB"   # VmHWM, in KB
