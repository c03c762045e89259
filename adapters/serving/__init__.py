"""Serving mode's client side and process: an engine's server started and stopped
(server_process.py), the HTTP calls (http_client.py), the load generator (load_generator.py), output
capture through the API (capture.py) and the SLO search (slo_search.py).

May import: adapters.contract, adapters.meters, adapters.base.
"""
