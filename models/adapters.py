"""A pretrained causal LM fine-tuned with adapters to answer in text: the direct and
chain-of-thought baselines of a pretrained Thinking States model (``smollm2-direct``,
``smollm2-cot``), trained by the same resumable loop (`models.thinking.train`) on the same stories.

Only the adapters are stored (``adapters.safetensors``, kind ``adapters`` in the model card); at
load time they are composed over the backbone they were trained on (its hash is checked, as for
Thinking States parts) and merged into its weights, so the result is a plain model.

>>> from beliefscope.models.testing import tiny_llama
>>> from beliefscope.models.tokenizer import toy_tokenizer
>>> from beliefscope.tasks import get_task
>>> tok = toy_tokenizer()
>>> model = AdaptedLM(tiny_llama(vocab=len(tok), bridge=False), tok)
>>> loss, parts = model.loss(model.make_batch(get_task("coinflip").examples(2, 0, (1, 2))))
>>> loss.item() > 0 and sorted(parts)
['lm']
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .lm_batch import make_batch
from .thinking.ckpt import load_composed

ADAPTERS_FILE = "adapters.safetensors"


class AdaptedLM(nn.Module):
    """A causal LM (with adapters) trained on completions only: ``loss`` is the LM loss on the
    completion tokens and the final <eos>."""

    def __init__(self, backbone, tok):
        super().__init__()
        self.backbone = backbone  # the HF causal LM, LoRA-wrapped where trained
        self.tok = tok  # its tokenizer (pads the batches)

    def make_batch(self, examples, device=None) -> tuple:
        """``(ids [B, T], labels [B, T], mask [B, T])``: right-padded, labels on the completion."""

        return make_batch(self.tok, examples, device)

    def loss(self, batch) -> tuple[torch.Tensor, dict]:
        ids, labels, mask = batch
        pred = (labels[:, 1:] != -100).any(0).nonzero().squeeze(-1)  # [k] positions whose next token is a target
        h = self.backbone.base_model(input_ids=ids, attention_mask=mask).last_hidden_state  # [B, T, d]
        logits = self.backbone.get_output_embeddings()(h[:, pred])  # [B, k, vocab]: only where it is needed
        lm = F.cross_entropy(logits.flatten(0, 1).float(), labels[:, pred + 1].flatten(), ignore_index=-100)
        return lm, {"lm": lm.item()}


def load_adapted(name_or_path: str, path: str, card: dict, device, dtype):
    """The backbone with its trained adapters merged in (`load_composed` merges them): ``(HF model, tokenizer)``."""

    model, tok = load_composed(name_or_path, path, card, device, dtype, build=AdaptedLM)
    return model.backbone.eval(), tok
