"""`python -m adapters.worker SPEC.json OUT_DIR` (adapters/worker/group.py)."""

import sys

from adapters.contract.processes import end_group_with_me
from adapters.worker.group import exit_now, main

# vLLM starts its engine core with spawn, which imports this module again as __mp_main__: only the
# real entry point may run the group
if __name__ == "__main__":
    end_group_with_me()   # the engine's own processes (vLLM's engine core, a server) end with this one, however it ends
    exit_now(main(sys.argv[1], sys.argv[2]))
