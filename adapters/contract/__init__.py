"""The contract between the orchestrator and the engine processes: what crosses the boundary, typed.

Both sides import it; it imports the standard library, numpy and pydantic only (and, within a
function, the tokenizers library and pynvml), so every engine environment can import it:

  specs.py       what the driver hands a worker (`GroupSpec` and its parts)
  events.py      what a worker reports while it runs (`WorkerEvent`, `LoadFacts`)
  records.py     what a cell's measurement becomes (`CellRecord`, task outputs, the logprob and sample
                 row layouts, the one top-k rule)
  timing.py      the timing types and the one `summarize` of every latency and throughput figure
  intervals.py   confidence intervals for throughputs and speed-ups over a few repeats
  host.py        what a host is (`HostFacts`), gathered once by `host_facts()` on either side
  tokenizer.py   the model's tokenizer, the same on both sides
  openai_api.py  what an engine's OpenAI-compatible server does, and the request bodies sent to it
  claims.py      which node runs a cell when unstarted cells move between nodes
  disturbance.py how disturbed each timed repeat was by the rest of the host (CPU from /proc, GPU from NVML)
  processes.py   how a started process ends with its parent, and an engine's processes with the engine child

May import: nothing of adapters/ or orchestrator/ outside this folder.
"""
