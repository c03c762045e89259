"""`bench diff-endpoints`: two live OpenAI-compatible servers sent the same prompts (diff.py), greedy outputs
compared and seeded samples tested as distributions with the sampling layer's own tests. It is the one part of
the driver that talks to live servers, so it sits apart from orchestrator/judge (stored runs alone).

May import: orchestrator.judge, adapters.contract.
"""
