"""What is measured beside the engines, kept apart from them: peak memory of the engine's process
tree (memory.py), energy from RAPL/NVML (energy.py), the engine's own Prometheus metrics
(telemetry.py), and what a cell ran on (provenance.py: the model's fingerprint, the host).

May import: adapters.contract.
"""
