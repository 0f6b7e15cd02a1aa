"""Two sections of the toy demo's report: the validated instrument on ``thinking`` (the report's
opening: thought and forced-answer accuracy by band, probe vs thought, the causal check) and the
belief viewer on the demo's stories (a link to ``view.html`` beside the report)."""

from __future__ import annotations

import html
import os

from beliefscope.analyses import report

GROUPS = ("instrument", "target", "decoding", "viewer")  # the report's order of sections


def instrument_section(cfg, summary: dict) -> dict:
    """`instrument` on ``thinking`` alone (two bands, the causal check); numbers into ``summary``."""
    from beliefscope.analyses.instrument import InstrumentConfig, table_lines
    from beliefscope.analyses.instrument import main as instrument_main

    q = cfg.quick
    inst = instrument_main(InstrumentConfig(models=("thinking",), n_train=16 if q else 60, n_test=6 if q else 20,
                                            bands=("1-8", "9-16"), causal_n=4 if q else 20))
    summary["thinking_instrument"] = inst
    table = "<pre>" + html.escape("\n".join(table_lines(inst))) + "</pre>"
    return {"title": "The validated instrument: thinking, a model whose beliefs are known", "figures": [],
            "reading": report.reading_instrument(inst["models"]["thinking"]), "html": table, "group": "instrument"}


def viewer_section(cfg, tmp: str, summary: dict, bars) -> dict:
    """The belief viewer on the demo's stories: thinking beside the target, decoded speculatively."""
    from beliefscope.analyses.view import ViewConfig
    from beliefscope.analyses.view import main as view_main

    n = 2 if cfg.quick else 6
    bar = bars("viewer", 3 * n)
    v = view_main(ViewConfig(models=("thinking", cfg.model), events="9-16", n=n, n_train=40 if cfg.quick else 120,
                             drafter=f"draft:{cfg.draft}", out=os.path.join(tmp, "view.html")), progress=bar.update)
    bar.close()
    v["out"], v["files"] = "view.html", ["view.html"]
    summary["view"] = v
    return {"title": "The belief viewer: every token, every layer", "figures": [], "reading": report.reading_view(v),
            "group": "viewer",
            "html": f"<p><a href='view.html'>view.html</a> ({v['bytes']:,} bytes, one file, no network): hover or "
                    "focus a token for the truth, the probe at every layer, the forced answer, the thought and the "
                    "KV-cache provenance of the speculative decode.</p>"}
