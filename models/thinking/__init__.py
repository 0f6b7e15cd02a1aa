"""Thinking States (Amos et al. 2026, arXiv 2602.08332) in one place: a model whose intermediate
beliefs exist, so it is the ground truth the instrument is checked against.

| module | what it holds |
|---|---|
| `model` | `ThinkingStates`: the backbone, the Thinking block T and the Compression block C; teacher-forced loss |
| `config` | `ThinkingConfig` (layers, chunking, thought length), `chunk_spans`, `THOUGHT` (T's cache tag) |
| `data` | gold thoughts and training batches from the tasks' labels |
| `ckpt` | checkpoints: a whole model, or only the trained parts over a hashed backbone (`load_thinking`) |
| `train` | training (`train_thinking`, the presets, cost measurement) and `cli` its command |
| `drafter` | `ThoughtDrafter`: drafts each chunk's thought before T verifies it |
| `prefill` | `SpeculativePrefill`: speculative prefill as a policy of the decoding engine |
| `chunked` | `ChunkedThinking` (chunked prefill, greedy answer) and `ThoughtDecode` (T's thought): engine policies |

The seam to the engine is its policies (`prefill`, `chunked`), which ``decoding.engine.run`` steps:
``decoding.thinking.run_thinking`` (one story, a batch of one) and ``decoding.thinking_batch.run_thinking_batch``
(many) hand them to the engine, and are the only Thinking States code that sits in ``decoding``.

>>> from beliefscope.models.thinking import ThinkingConfig
>>> ThinkingConfig().chunking
'events'
"""

from .config import THOUGHT, ThinkingConfig, chunk_spans
from .model import ThinkingStates

__all__ = ["THOUGHT", "ThinkingConfig", "ThinkingStates", "chunk_spans"]
