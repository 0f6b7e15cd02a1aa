"""One way to run a model: the `Runner` protocol.

`load_model` returns a TransformerBridge over a Hugging Face causal LM, or a Thinking States model
(`models.thinking.ThinkingStates`, whose thoughts are written by blocks of its own). Both are runners,
and a caller uses either the same way:

- ``runner(ids, return_type="logits")``: the forward the model runs. A Thinking States model writes
  its thoughts first and injects them; hooks see that pass.
- ``runner.run_with_cache(ids, ...)``, ``runner.run_with_hooks(ids, ...)``, ``runner.hooks(...)``:
  TransformerLens's hooks by name, over that same forward.
- ``runner.cfg`` (TransformerLens's config) and `models.profile.model_shapes` (layers, heads, device).

Under both, every forward that a decoding loop, a verify step or a capture makes goes through one door,
`models.bare.runnable`: the HF tree without TransformerLens's wrappers when no hook watches, the
wrapped tree when one does, so a capture sees the forward that decoding ran. The door refuses a
Thinking States model, because its HF model alone is its backbone without the thoughts its answers
are read after; such a model decodes through `decoding.thinking.run_thinking`, and its bridge's own
decoding methods (``generate`` and the like) are refused by name.

Where the two kinds are read differently (a Thinking States model's beliefs are read after its
thoughts, chunk by chunk), the caller asks `models.profile.writes_thoughts`, and nothing else.

>>> from beliefscope.models.testing import tiny_llama
>>> isinstance(tiny_llama(), Runner)
True
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Runner(Protocol):
    """What every model `load_model` returns offers (see the module doc)."""

    cfg: Any  # TransformerLens's config: n_layers, d_model, n_heads, d_vocab, device, ...

    def __call__(self, input_ids, return_type: str | None = "logits", **kwargs):
        """The forward the model runs: logits ``[batch, pos, d_vocab]`` for ``return_type="logits"``."""

    def run_with_cache(self, input_ids, *args, **kwargs):
        """``(output, ActivationCache)`` over the same forward."""

    def run_with_hooks(self, input_ids, *args, **kwargs):
        """The same forward with ``fwd_hooks=[(name, fn), ...]`` attached for its duration."""

    def hooks(self, *args, **kwargs):
        """A context in which TransformerLens hooks by name are attached."""
