"""Which node runs a cell, when the driver moves unstarted cells of a running group to another node
(work stealing, orchestrator/execution/scheduling/ledger.py): a claim file per cell in the group's claims directory, on the
node that runs the group. The engine worker claims each cell before it starts it, and the group's task
claims the cells it hands over, so each cell runs exactly once."""

from __future__ import annotations

import os


def claim_cell(claims_dir: str, cell_id: str) -> bool:
    """Claim a cell in claims_dir: True for the one caller that creates its file, False for every later one.
    The worker claims each cell before it starts it; the launcher claims the cells the driver moves to
    another node (work stealing), so a cell runs on one node or the other, never both (O_EXCL is atomic)."""
    try:
        os.close(os.open(os.path.join(claims_dir, cell_id), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True
