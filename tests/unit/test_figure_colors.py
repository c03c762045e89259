"""Every plot colours a configuration the same in every panel and in the shared legend: each trace names
its colour (history.html's tokens/s, TTFT and KL panels; report.html's throughput/TTFT/TPOT panels)."""

import json
from collections import defaultdict

import numpy as np
import pandas as pd

from orchestrator.report.data import load
from orchestrator.report.figures import speed_figure
from orchestrator.report.history_html import history_figure, render_history_html
from tests.helpers import ROOT


def _colours(fig) -> dict[str, dict]:
    """Per trace name: the colours its traces draw in (line, marker, error bars) and the panels (y axes)."""
    got = defaultdict(lambda: {"colours": set(), "axes": set(), "legend": 0})
    for t in json.loads(fig.to_json())["data"]:
        g = got[t["name"]]
        g["colours"] |= {c for c in (t.get("line", {}).get("color"), t.get("marker", {}).get("color"),
                                     t.get("error_y", {}).get("color")) if c is not None}
        g["axes"].add(t.get("yaxis", "y"))
        g["legend"] += t.get("showlegend", True) is not False
        assert t.get("line", {}).get("color") and t.get("marker", {}).get("color"), t["name"]  # explicit, never the colourway
    return dict(got)


def _history(configs=("hf/fp32", "llamacpp/q8_0", "vllm/fp16")) -> pd.DataFrame:
    rows = []
    for run in ("r1", "r2", "r3"):
        for i, cfg in enumerate(configs):
            fw, q = cfg.split("/")
            rows.append({"run": run, "started": f"2026-12-0{run[1]}", "cell_id": cfg, "framework": fw, "model": "tiny",
                         "quantization": q, "flags": "default", "mode": "offline", "batch_size": 1,
                         "request_rate": None, "status": "ok", "verdict": "lossless", "changed": "first run",
                         "output_tok_s": 100.0 * (i + 1),
                         # vllm has no TTFT in any run, hf no KL (the baseline): a panel without a config
                         # must not shift the colours of the others
                         "ttft_ms_p50": np.nan if fw == "vllm" else 5.0 + i,
                         "kl_mean": 0.0 if fw == "hf" else 1e-3 * (i + 1)})
    return pd.DataFrame(rows)


def test_history_colours_each_configuration_once_across_panels():
    df = _history()
    got = _colours(history_figure(df))
    assert len(got) == 3
    for name, g in got.items():
        assert len(g["colours"]) == 1, (name, g)               # one colour in every panel
        assert g["axes"] == {"y", "y2", "y3"} and g["legend"] == 1, (name, g)   # each panel, legend once
    assert len({c for g in got.values() for c in g["colours"]}) == 3   # and no two configurations share one
    # the page embeds the same colours
    page = render_history_html(df, "t")
    for g in got.values():
        assert page.count(f'"color":"{next(iter(g["colours"]))}"') >= 6   # line and marker in 3 panels
    # drawn again from the same runs in another row order: the same colours (sorted names, not trace order)
    again = _colours(history_figure(df.iloc[::-1]))
    assert all(again[n]["colours"] == got[n]["colours"] for n in again)


def test_report_speed_panels_colour_each_configuration_once():
    df, *_ = load(ROOT / "tests" / "data" / "golden" / "runs" / "new", tasks=False)
    got = _colours(speed_figure(df))
    assert len(got) == 4   # the ok cells' configurations
    for name, g in got.items():
        assert len(g["colours"]) == 1 and g["axes"] == {"y", "y2", "y3"}, (name, g)
    assert len({c for g in got.values() for c in g["colours"]}) == 4
