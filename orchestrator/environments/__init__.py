"""Engine environments of the env axis (matrix `envs`): `bench env NAME --pip SPEC` creates one, layered on an
existing environment with one package changed (create.py). What differs between two environments is
recorded by the engine child (adapters/contract/events.py: EnvFacts) and diffed by the judge
(orchestrator/judge/cross_run.py: provenance_changes).

May import: orchestrator.values. Nothing else of the project.
"""
