"""The viewer's single HTML file: the data as JSON in the page, the script and stylesheet inline, and
a Content-Security-Policy that forbids every fetch, so the page works offline and reaches nothing.

>>> page = render({"task": "coinflip", "state_names": ["heads", "tails"], "events": "1-2", "models": [],
...                "stories": [], "decode": None})
>>> page.startswith("<!doctype html>"), "://" in page  # no URL anywhere
(True, False)
>>> page_data(page)["task"]
'coinflip'
"""

from __future__ import annotations

import html
import json

from .view_assets import CSS, JS

# No network at all: no default source, inline style and script only, images only as data: URIs.
CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"


def summary_sentence(data: dict) -> str:
    """One sentence computed from the data: how often each model's probe follows the truth."""
    if not data["models"]:
        return "No model to show."
    parts = []
    for m in data["models"]:
        layer = m["layers"][m["best"]]
        where = "the embedding" if layer < 0 else f"layer {layer}"
        parts.append(f"{m['name']}'s probe at {where} follows the truth on {100 * m['probe_accuracy_at_best']:.0f}% "
                     "of the tokens after the first event")
    counts = [st["n_events"] for st in data["stories"] if "n_events" in st]  # the stories shown, not a requested band
    lo, hi = (min(counts), max(counts)) if counts else (None, None)
    events = data["events"] if lo is None else (f"{lo}" if lo == hi else f"{lo}-{hi}")
    s = f"Over {len(data['stories'])} {data['task']} stories ({events} events), " + "; ".join(parts) + "."
    if data.get("decode"):
        acc = [r["acceptance"] for r in data["decode"]["stories"] if r["acceptance"] is not None]
        if acc:
            s += (f" Decoded speculatively, {data['decode']['model']} accepted {100 * sum(acc) / len(acc):.0f}% of "
                  f"the drafted tokens on average.")
    return s


def render(data: dict) -> str:
    """The page for `data` (from `view.build`): one string, no external reference."""
    blob = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    title = f"beliefscope view: {', '.join(m['name'] for m in data['models'])} on {data['task']}"
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<meta http-equiv='Content-Security-Policy' content=\"{CSP}\">"
            f"<meta name='viewport' content='width=device-width,initial-scale=1'><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body><div id='wrap'><div id='main'><header><h1>{html.escape(title)}</h1>"
            f"<p id='summary'>{html.escape(summary_sentence(data))}</p><div class='legend' id='legend'></div>"
            "<div class='controls' id='controls'></div><p class='muted'>Hover or focus a token (Tab, then the arrow "
            "keys; [ and ] change the layer) to see every layer's reading, the forced answer, the thought and the "
            "cache provenance.</p></header><div id='stories'></div><div id='decode'></div></div>"
            "<aside id='inspector' aria-live='polite'><p class='muted'>No token selected.</p></aside></div>"
            f"<script type='application/json' id='view-data'>{blob}</script><script>{JS}</script></body></html>")


def page_data(page: str) -> dict:
    """The JSON object a page was built from (what its script draws)."""
    start = page.index("<script type='application/json' id='view-data'>")
    start = page.index(">", start) + 1
    return json.loads(page[start:page.index("</script>", start)])
