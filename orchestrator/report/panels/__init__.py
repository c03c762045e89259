"""The report's panels that are a layer or a source of their own, each defined once for both formats (report.html
and report.md): the sampling layer (sampling.py), the SLO searches and `bench explain`'s culprit searches
(searches.py), the engines' telemetry and energy (telemetry.py)."""
