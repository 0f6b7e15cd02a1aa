"""Coin-flip stories as chat requests for instruction-tuned models (SmolLM2-Instruct).

The stories end with a question and `` A:`` for base models; a chat model is asked instead to
rewrite the story event by event, which makes it write long, input-grounded text (the workload
of the speculative-decoding benchmark and of the n-gram store the retrieval drafter uses).

>>> strip_answer_cue("Is the coin heads or tails now? A:")
'Is the coin heads or tails now?'
"""

from __future__ import annotations

from .coinflip import sample_prompts

REWRITE_INSTRUCTION = ("Rewrite this story as a numbered list of events. After each event, say whether the coin "
                       "now shows heads or tails.\n\n")


def strip_answer_cue(story: str) -> str:
    s = story.rstrip()
    return s[:-2].rstrip() if s.endswith("A:") else s


def chat_prompts(tok, n: int, seed: int, events=(5, 9), split: str = "heldout",
                 instruction: str = REWRITE_INSTRUCTION) -> list[str]:
    """``n`` natural coin-flip stories as user turns in ``tok``'s chat template (plain text without one).

    ``split`` picks the story templates and names: the n-gram store is built on ``train`` and the
    benchmark runs on ``heldout``, so the store never saw the benchmark's phrasings.
    """
    out = []
    for story in sample_prompts(n, seed, events, "natural", split=split):
        text = instruction + strip_answer_cue(story)
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                           add_generation_prompt=True)
        out.append(text)
    return out
