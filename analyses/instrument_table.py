"""The belief instrument's Markdown: a table (model x band) of accuracies against the truth and pairwise agreement,
and one line per finding (verdicts, the lens sentence, the causal tests, the Thinking States check)."""

from __future__ import annotations

COLUMNS = (("probe_accuracy", "probe"), ("forced_accuracy", "forced"), ("thought_accuracy", "thought"),
           ("probe_forced_agreement", "probe=forced"), ("probe_thought_agreement", "probe=thought"),
           ("forced_thought_agreement", "forced=thought"), ("control_accuracy", "control"))


def table_lines(res: dict) -> list[str]:
    """A Markdown table (model x band) of accuracies against the truth and pairwise agreement."""
    head = "| model | events | " + " | ".join(c for _, c in COLUMNS) + " | random-init |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 3)]
    for name, r in res["models"].items():
        for band, b in r["bands"].items():
            cells = [f"{b[k]:.3f}" if k in b else "-" for k, _ in COLUMNS]
            ri = r.get("random_init_probe_accuracy")
            ri_cell = f"{ri:.3f}" if ri is not None and band == next(iter(r["bands"])) else ""
            lines.append(f"| {name} (`{r['hook']}`) | {band} | " + " | ".join(cells) + f" | {ri_cell} |")
    lines.append("")
    for name, r in res["models"].items():
        lines.append(f"- {r['verdict']}.")
        if "lens" in r:
            lines.append(f"- {name}, {r['lens']['n_stories']} stories of {next(iter(r['bands']))} events: "
                         f"{r['lens']['sentence']}.")
        lines += [f"- {name}: {line.strip()}" for line in r.get("causal_tests", {}).get("lines", [])]
        if "causal" in r:
            c = r["causal"]
            lines.append(f"- causal check on {name} ({c['n']} prompts): swapping S at one chunk for another state's "
                         f"changes the answer {c['answer_flip_rate_swap']:.2f}, to the answer that state leads to "
                         f"{c['answer_follows_swap']:.2f}, and every later thought names the replayed state "
                         f"{c['downstream_thoughts_follow_swap']:.2f}; random vectors of equal norm "
                         f"{c['answer_flip_rate_random']:.2f} / {c['answer_follows_random']:.2f} / "
                         f"{c['downstream_thoughts_follow_random']:.2f}.")
        for band, b in r["bands"].items():
            if "variable_probe_accuracy" in b:
                accs = ", ".join(f"{v} {a:.2f}" for v, a in b["variable_probe_accuracy"].items())
                lines.append(f"- {name}, {band} events: a probe for every variable's value reads {accs}.")
    return lines
