"""How a model answers the question a person asks: one table of answers and thoughts on template
stories (the held-out bands, fixed and varied question forms) and on the hand-written
free-wording stories (`tasks.coinflip_free`), each as plain text and inside the chat template.

Rows (``n`` stories each; the free set has its own size): ``template 1-8`` / ``9-16`` / ``17-32``
(held-out templates and names, the fixed questions the model card has always reported),
``varied 1-8`` (held-out question forms, before or after the story, with or without ``A:``), and
``free`` (every hand-written story); each with ``+chat`` too.

Usage (not run as a doctest: it needs a trained model)::

    model, tok = load_model("smollm2-thinking")
    table = question_table(model, tok, n=100)
    table["free"]["answer_top1"], table["free+chat"]["thought_accuracy"]
"""

from __future__ import annotations

from .evaluate import evaluate

# (row name, events band, split, question forms, chat template)
ROWS = (("template 1-8", "1-8", None, "fixed", False), ("template 9-16", "9-16", None, "fixed", False),
        ("template 17-32", "17-32", None, "fixed", False), ("varied 1-8", "1-8", None, "varied", False),
        ("varied 1-8+chat", "1-8", None, "varied", True), ("free", "1-8", "free", "fixed", False),
        ("free+chat", "1-8", "free", "fixed", True))
KEYS = ("answer_accuracy", "answer_top1", "answer_follows_thought", "thought_accuracy", "thought_exact", "n")


def question_table(model, tok, n: int = 100, rows=ROWS, progress=None, full: dict | None = None) -> dict:
    """``{row: {answer_accuracy, answer_top1, answer_follows_thought, thought_accuracy, ...}}`` for a
    Thinking States model, or the answer columns only for a plain (direct-answer) model. ``full``, when a
    dict, gets each row's whole `evaluate` result."""

    out = {}
    for name, band, split, questions, chat in rows:
        res = evaluate(model, "coinflip", band, 120 if split == "free" else n, tokenizer=tok, rendering="natural",
                       formats=("direct",), split=split, questions=questions, chat=chat, progress=progress)
        out[name] = {k: round(res[k], 4) if isinstance(res[k], float) else res[k] for k in KEYS if k in res}
        if full is not None:
            full[name] = res
    return out


def rows_total(n: int, rows=ROWS, n_free: int = 120) -> int:
    """Stories the table reads (its progress total)."""
    return sum(n_free if split == "free" else n for _, _, split, _, _ in rows)


def card_with_table(card: dict, table: dict, full: dict) -> dict:
    """``card`` with ``eval_questions`` set to ``table`` and ``eval[band]`` to the template rows' whole results
    (the bands every model card reports), other fields kept."""
    bands = {name.split()[1]: full[name] for name in table if name.startswith("template ")}
    keep = ("answer_accuracy", "answer_top1", "answer_follows_thought", "thought_accuracy", "thought_exact",
            "thoughts", "n", "task", "events", "seed", "split")
    evals = dict(card.get("eval") or {})
    for band, res in bands.items():
        evals[band] = {k: round(res[k], 4) if isinstance(res[k], float) else res[k] for k in keep if k in res}
    return {**card, "eval": evals, "eval_questions": table}


def table_lines(table: dict) -> list[str]:
    """The table as aligned text lines (``-`` where a column does not apply)."""
    cols = ("answer_accuracy", "answer_top1", "answer_follows_thought", "thought_accuracy")
    lines = [f"{'stories':<18}" + "".join(f"{c:>24}" for c in cols) + f"{'n':>6}"]
    for name, r in table.items():
        cells = "".join(f"{r[c]:>24.4f}" if c in r else f"{'-':>24}" for c in cols)
        lines.append(f"{name:<18}{cells}{r['n']:>6}")
    return lines
