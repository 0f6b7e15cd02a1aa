"""Thinking States: a model whose intermediate beliefs exist (Amos et al. 2026, arXiv 2602.08332).

The input is processed in chunks. After each complete chunk a Thinking block T reads the
backbone's hidden states at layer ``l_out`` and writes thought tokens Z_i ("tails <eos>"); a
Compression block C turns Z_i into a state S_{i+1}, which is added to every token of the next
chunk at ``blocks.{l_in}.hook_resid_pre``. The thoughts never enter the backbone's context.

- T and C are one decoder block each, built from the backbone's config and (by default)
  initialised from its last and first blocks. T shares the backbone's embedding and unembedding.
- Training is teacher-forced and parallel: gold thoughts give gold states, every chunk runs in
  one forward, and the loss is the LM loss plus the thought loss (`ThinkingStates.loss`).
- `ThinkingStates` is a `models.runner.Runner` over a twin of its backbone (the same parameters, its
  own modules), so hooks and captures work as on any model (``model.cfg``, ``run_with_cache``...): calling
  it on token ids first works out its own thoughts (on the plain backbone, firing no hook), then runs the
  twin once with the states injected, so every capture and probe sees the model as it really runs.
- Chunk-by-chunk inference over `cache.KVCache` is in `decoding.thinking`.

Its configuration and chunking live in `models.thinking.config` (re-exported here).
"""

from __future__ import annotations

import copy
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModel, DynamicCache

from ...hooks.capture import hooked
from ..bridge import cache_kwarg, guard_cache_handoff, input_device
from ..errors import ThoughtsSkippedError
from ..forward import forward_module
from ..internals import version_stamp
from ..profile import decoder_layers
from ..runner import Runner
from .config import ThinkingConfig, chunk_spans
from .twin import TWIN, twin_not_missing, twin_of

__all__ = ["ThinkingConfig", "ThinkingStates", "chunk_spans", "decoder_layers"]


def _one_block_model(config):
    """A one-block base model for T or C, without its token table (both take ``inputs_embeds`` and
    share the backbone's embedding): returns ``(model, names of the dropped parameters)``."""

    cfg = copy.deepcopy(config)
    cfg.num_hidden_layers = 1
    cfg.architectures = None
    cfg.quantization_config = None
    model = AutoModel.from_config(cfg)
    emb = model.get_input_embeddings()
    for name, child in list(model.named_children()):
        if child is emb:
            setattr(model, name, None)  # [vocab, d] unused: a SmolLM2-sized table is 113 MB per block
            return model, [f"{name}.weight"]
    return model, []


# the bridge's methods that decode or run a forward of their own (TransformerLens 4): reached through a
# Thinking States model they would run its backbone without the thoughts, so they are refused by name

class ThinkingStates(Runner):
    """Thinking States over a HF causal LM; see the module docstring."""

    def __init__(self, backbone, tokenizer, config: ThinkingConfig | None = None):
        config = config or ThinkingConfig()
        n_layers = len(decoder_layers(backbone))
        config.check(n_layers)
        guard_cache_handoff(backbone)  # decodes into a KVCache (decoding.thinking)
        super().__init__(twin_of(backbone), tokenizer, name_or_path="thinking")  # the twin: hooks and captures
        self.thinking_config = config
        self.l_in = config.l_in
        self.l_out = config.l_out % n_layers
        self.backbone = backbone  # the plain HF model: training and the thought pass (fires no TL hook)
        self.T, t_drop = _one_block_model(backbone.config)  # Thinking block: reads L_out states, writes Z_i
        self.C, c_drop = _one_block_model(backbone.config)  # Compression block: Z_i -> S_{i+1}
        # keys older checkpoints hold for T's and C's unused token tables (ignored on loading)
        self.dropped_keys = {f"T.{k}" for k in t_drop} | {f"C.{k}" for k in c_drop}
        d = backbone.get_input_embeddings().weight.shape[1]
        self.out_proj = nn.Linear(d, d, bias=False)  # C's last hidden state -> S (zero at start: S = 0)
        nn.init.zeros_(self.out_proj.weight)
        if config.init_from_backbone:
            decoder_layers(self.T)[0].load_state_dict(decoder_layers(backbone)[-1].state_dict())
            decoder_layers(self.C)[0].load_state_dict(decoder_layers(backbone)[0].state_dict())
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.eos_token_id
        self.boundary_id = tokenizer.convert_tokens_to_ids(config.boundary) if config.chunking == "events" else None
        guard_cache_handoff(self.T)  # decodes into a KVCache too (decoding.thinking)
        self.register_load_state_dict_post_hook(twin_not_missing)

    def state_dict(self, *args, **kwargs):
        """The module's state without the twin's entries (``hf.*``): they are the backbone's own tensors."""
        return {k: v for k, v in super().state_dict(*args, **kwargs).items() if not k.startswith(TWIN)}

    # ------------------------------------------------------------------ what differs from a plain Runner
    def generate(self, *args, **kwargs):
        """Refused: TransformerLens's ``generate`` would decode the backbone without its thoughts."""
        raise ThoughtsSkippedError(
            f"{self.name_or_path!r} is a Thinking States model: the bridge's generate() would decode its "
            "backbone without its thoughts. Decode it with beliefscope.decoding.thinking.run_thinking (what "
            f"`beliefscope generate --model {self.name_or_path}` runs)")

    def forward(self, input_ids, return_type: str | None = "logits", **kwargs):
        """Run the model as it really runs: its own thoughts, then one forward of the twin with the
        states injected at ``blocks.{l_in}.hook_resid_pre`` (the only pass hooks see)."""
        ids = self._batch(input_ids)
        add, _ = self.self_states(ids)
        with self.injecting(add):
            return super().forward(ids, return_type=return_type, **kwargs)

    def run_with_cache(self, input_ids, *args, **kwargs):
        """TransformerLens's ``run_with_cache`` over the forward the model runs (its thoughts injected), so
        the cache holds what `forward` computes; ``blocks.{l_in}.hook_resid_pre`` is cached after the states
        are added. Returns ``(output, ActivationCache)`` as the bridge's does."""
        ids = self._batch(input_ids)
        add, _ = self.self_states(ids)
        with self.injecting(add):
            return self.bridge.run_with_cache(ids, *args, **kwargs)

    def run_with_hooks(self, input_ids, *args, **kwargs):
        """TransformerLens's ``run_with_hooks`` over the forward the model runs (its thoughts injected)."""
        ids = self._batch(input_ids)
        add, _ = self.self_states(ids)
        with self.injecting(add):
            return self.bridge.run_with_hooks(ids, *args, **kwargs)

    def _batch(self, input_ids) -> torch.Tensor:
        ids = torch.as_tensor(input_ids).to(input_device(self.backbone))
        return ids[None] if ids.dim() == 1 else ids  # [batch, pos]

    @contextmanager
    def injecting(self, add: torch.Tensor):
        """Add ``add`` (``[batch, pos, d_model]``, aligned with the forward's tokens) at
        ``blocks.{l_in}.hook_resid_pre`` of the twin for the duration of the block."""

        def fn(act, *, hook):
            return act + add[:, -act.shape[1]:].to(act.dtype)

        with hooked(self, [(f"blocks.{self.l_in}.hook_resid_pre", fn)]):
            yield

    # ------------------------------------------------------------------ the blocks
    def embed(self, ids):
        return self.backbone.get_input_embeddings()(ids)

    def compress(self, thought_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """S from thoughts: ``thought_ids [n, k]`` right-padded, ``lengths [n]`` -> ``[n, d_model]``."""
        k = thought_ids.shape[1]
        mask = (torch.arange(k, device=thought_ids.device)[None] < lengths[:, None]).long()  # [n, k]
        h = self.C(inputs_embeds=self.embed(thought_ids), attention_mask=mask).last_hidden_state  # [n, k, d]
        last = h[torch.arange(len(h), device=h.device), (lengths - 1).clamp(min=0)]  # [n, d]
        return self.out_proj(last)

    def think_logits(self, states: torch.Tensor, mask: torch.Tensor, select=None, **kw) -> torch.Tensor:
        """T over left-padded ``states [n, L, d]`` (chunk states, then embedded thought tokens):
        logits ``[n, L, vocab]``, or ``[k, vocab]`` at the ``select [n, L]`` (bool) slots only."""
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        h = self.T(inputs_embeds=states, attention_mask=mask, position_ids=pos, **kw).last_hidden_state
        return self.backbone.get_output_embeddings()(h if select is None else h[select])

    @torch.no_grad()
    def think(self, chunk_states: list[torch.Tensor]) -> list[list[int]]:
        """Greedy thoughts for a list of chunks' L_out states (each ``[c, d]``), batched.

        Thought lookup: the thoughts already compressed (`state_from_thoughts` remembers them) are
        likely again, so the first forward also feeds each of the most recent ones after every
        chunk (one row per chunk and candidate) and keeps, per chunk, the tokens greedy decoding
        confirms. A coin flip's thought ("heads" <eos>) then takes one forward of T instead of two.
        The thoughts are those of plain greedy decoding: a candidate only saves forwards."""
        n, width = len(chunk_states), max(len(s) for s in chunk_states)
        d, cap = chunk_states[0].shape[-1], self.thinking_config.max_thought
        states = chunk_states[0].new_zeros(n, width + cap, d)  # left-padded chunks, thoughts to the right
        mask = torch.zeros(n, width + cap, dtype=torch.long, device=states.device)
        for i, s in enumerate(chunk_states):
            states[i, width - len(s): width] = s
            mask[i, width - len(s): width] = 1
        out = self._look_up_thoughts(states, mask, width) or [[] for _ in range(n)]
        while True:
            todo = [i for i in range(n) if not out[i] or (out[i][-1] != self.eos_id and len(out[i]) < cap)]
            if not todo:
                return out
            for i in todo:  # the tokens decided so far go in as T's input
                if out[i]:
                    states[i, width: width + len(out[i])] = self.embed(torch.tensor(out[i], device=states.device))
                    mask[i, width: width + len(out[i])] = 1
            cur = max(len(out[i]) for i in todo)
            logits = self.think_logits(states[todo, : width + cur], mask[todo, : width + cur])  # [len(todo), w, V]
            for r, i in enumerate(todo):
                out[i].append(int(logits[r, width - 1 + len(out[i])].argmax()))

    def _look_up_thoughts(self, states, mask, width) -> list[list[int]] | None:
        """The thought-lookup forward of `think`: per chunk, the tokens greedy decoding gives that a
        remembered thought predicted (at least the first token); None when nothing is remembered."""
        cap = self.thinking_config.max_thought
        memo = self.__dict__.get("_memo", {})  # a stale memo only proposes: greedy decoding still decides
        cands = [list(t) for t in reversed(memo) if 1 < len(t) <= cap][: self.thinking_config.lookup]
        if not cands:
            return None
        n, m = len(states), len(cands)
        rows = states.repeat_interleave(m, 0)  # [n * m, width + cap, d]: row i * m + c is chunk i, candidate c
        rmask = mask.repeat_interleave(m, 0)
        for c, z in enumerate(cands):
            rows[c::m, width: width + len(z) - 1] = self.embed(torch.tensor(z[:-1], device=states.device))
            rmask[c::m, width: width + len(z) - 1] = 1
        w = width + max(len(z) for z in cands) - 1
        pred = self.think_logits(rows[:, :w], rmask[:, :w]).argmax(-1)  # [n * m, w]
        out = []
        for i in range(n):
            first = int(pred[i * m, width - 1])
            c = next((c for c, z in enumerate(cands) if z[0] == first), None)
            z = [first]
            while c is not None and z[-1] != self.eos_id and len(z) < len(cands[c]) and z[-1] == cands[c][len(z) - 1]:
                z.append(int(pred[i * m + c, width - 1 + len(z)]))
            out.append(z)
        return out

    def state_from_thoughts(self, thoughts: list[list[int]]) -> torch.Tensor:
        """``[n, d_model]`` states from token lists (one per chunk).

        C reads only the thought's tokens, so S is a function of them. Under ``torch.no_grad`` each
        distinct thought is compressed once, alone, and remembered until a weight that C reads
        changes (C, ``out_proj`` or the token table: their storage and in-place version are compared).
        A coin-flip model has three thoughts, so inference runs C three times, not once per chunk;
        and S does not depend on which other thoughts shared the call. With gradients on (training),
        every call computes."""
        if torch.is_grad_enabled():
            return self._compress_lists(thoughts)
        memo = self._remembered_states()
        for t in dict.fromkeys(tuple(t) for t in thoughts):  # most recent last (the thought lookup reads it)
            memo[t] = memo.pop(t) if t in memo else self._compress_lists([list(t)])[0]  # [d]
        return torch.stack([memo[tuple(t)] for t in thoughts])  # [n, d]

    def _remembered_states(self) -> dict:
        """The thought -> S memo of `state_from_thoughts`, emptied when a weight C reads has changed."""
        stamp = version_stamp((*self.C.parameters(), self.out_proj.weight, self.backbone.get_input_embeddings().weight))
        if self.__dict__.get("_memo_stamp") != stamp:
            self.__dict__["_memo_stamp"], self.__dict__["_memo"] = stamp, {}
        return self.__dict__["_memo"]

    def _compress_lists(self, thoughts: list[list[int]]) -> torch.Tensor:
        """`compress` over token lists, right-padded with <eos>: ``[n, d_model]``."""
        dev = self.out_proj.weight.device
        k = max(1, max(len(t) for t in thoughts))
        ids = torch.full((len(thoughts), k), self.eos_id, dtype=torch.long, device=dev)
        for i, t in enumerate(thoughts):
            ids[i, : len(t)] = torch.tensor(t, dtype=torch.long)
        lengths = torch.tensor([max(1, len(t)) for t in thoughts], device=dev)
        return self.compress(ids, lengths)

    # ------------------------------------------------------------------ the backbone with S
    @contextmanager
    def _plain_hooks(self, add: torch.Tensor | None, keep: dict):
        """On the plain backbone: add ``add`` at the input of block l_in; keep block l_out's output."""
        layers = decoder_layers(self.backbone)

        def pre(module, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            h = h + add.to(h.dtype)
            return ((h, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": h})

        def post(module, args, output):
            keep["h"] = output[0] if isinstance(output, tuple) else output

        handles = [layers[self.l_out].register_forward_hook(post)]
        if add is not None:
            handles.append(layers[self.l_in].register_forward_pre_hook(pre, with_kwargs=True))
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def backbone_forward(self, ids, attention_mask=None, add=None, position_ids=None, keep_logits=None,
                         past_key_values=None):
        """Plain backbone forward with S injected; returns ``(logits [B, T, V], h_out [B, T, d])``.
        ``keep_logits [k]`` (positions, or an int: the last k): logits ``[B, k, V]`` there only.
        ``past_key_values``: a transformers cache the forward extends (chunk-by-chunk inference)."""
        keep: dict = {}
        extra = {} if keep_logits is None else {"logits_to_keep": keep_logits}
        if past_key_values is not None:
            extra.update({cache_kwarg(self.backbone): past_key_values, "use_cache": True})
        with self._plain_hooks(add, keep):
            logits = self.backbone(input_ids=ids, attention_mask=attention_mask, position_ids=position_ids,
                                   **extra).logits
        return logits, keep["h"]

    def spans(self, ids) -> list[tuple[int, int, bool]]:
        return chunk_spans(ids, self.thinking_config, self.boundary_id)

    @torch.no_grad()
    def self_states(self, ids: torch.Tensor, lengths=None, intervene=None):
        """The model's own thoughts and states for a batch, with no hook firing.

        ``ids [B, T]`` right-padded (``lengths[b]`` real tokens). Chunk j's L_out states depend only
        on S_0..S_j, so one plain forward per chunk index settles every row's S_{j+1}; the result is
        what chunk-by-chunk inference computes. ``intervene(row, j, S) -> S`` may replace a state.
        Returns ``(add [B, T, d], thoughts)``, thoughts[b] = ``[(chunk_end, tokens)]``."""
        B, Tn = ids.shape
        lengths = [Tn] * B if lengths is None else [int(x) for x in lengths]
        spans = [self.spans(ids[b, : lengths[b]].tolist()) for b in range(B)]
        d = self.out_proj.weight.shape[0]
        add = torch.zeros(B, Tn, d, device=ids.device)
        thoughts: list[list] = [[] for _ in range(B)]
        mask = (torch.arange(Tn, device=ids.device)[None] < torch.tensor(lengths, device=ids.device)[:, None]).long()
        for j in range(max(len(s) for s in spans)):
            rows = [b for b in range(B) if j < len(spans[b]) and spans[b][j][2]]
            if not rows:
                continue
            cut = max(spans[b][j][1] for b in rows)  # causal: later positions cannot matter to chunk j
            _, h = self.backbone_forward(ids[:, :cut], mask[:, :cut], add[:, :cut])
            zs = self.think([h[b, spans[b][j][0]: spans[b][j][1]] for b in rows])
            S = self.state_from_thoughts(zs)  # [len(rows), d]
            for i, b in enumerate(rows):
                thoughts[b].append((spans[b][j][1], zs[i]))
                if j + 1 < len(spans[b]):  # S_{j+1} goes to every token of chunk j+1
                    a, e, _ = spans[b][j + 1]
                    s = add[b, spans[b][j][0]] if self.carries(zs[i]) else S[i]
                    add[b, a:e] = s if intervene is None else intervene(b, j + 1, s)
        return add, thoughts

    @torch.no_grad()
    def cached_states(self, ids: list[int]):
        """One story chunk by chunk on a transformers ``DynamicCache``: each chunk is fed once, with
        its S added, and T thinks after each complete chunk (O(length), what inference computes;
        `decoding.thinking.run_thinking` does the same on an inspectable ``KVCache``). Returns
        ``(logits [V] at the last token, thoughts [(chunk_end, tokens)])``."""

        cache = DynamicCache(config=self.backbone.config)
        dev = next(self.parameters()).device
        S, thoughts, logits = None, [], None
        for a, e, complete in self.spans(ids):
            x = torch.tensor([ids[a:e]], device=dev)  # [1, c]
            add = None if S is None else S.expand(1, e - a, -1)  # [1, c, d]
            pos = torch.arange(a, e, device=dev)[None]  # [1, c]
            logits, h = self.backbone_forward(x, None, add, pos, keep_logits=1, past_key_values=cache)
            if complete:
                z = self.think([h[0]])
                thoughts.append((e, z[0]))
                if not self.carries(z[0]):
                    S = self.state_from_thoughts(z)[0]
        return logits[0, -1], thoughts

    def carries(self, thought: list[int]) -> bool:
        """Whether ``thought`` is empty (a bare <eos>) and, the model being trained with empty thoughts,
        carries the current S over to the next chunk."""
        return self.thinking_config.empty_unchanged and list(thought) == [self.eos_id]

    # ------------------------------------------------------------------ teacher-forced training
    def loss(self, batch, position_ids=None) -> tuple[torch.Tensor, dict]:
        """LM loss + thought loss for a `models.thinking.data.ThinkingBatch` (gold thoughts).
        ``position_ids [B, T]`` (optional): the backbone's positions, e.g. randomized in training."""
        S = self.compress(batch.thought_ids, batch.thought_len)  # [N, d]
        gather = S[batch.feed.clamp(min=0)] * (batch.feed >= 0)[..., None]  # [B, T, d]
        # logits only where the next token is a target (the same loss; a 49k-word head costs)
        pred = (batch.labels[:, 1:] != -100).any(0).nonzero().squeeze(-1)  # [k] positions
        logits, h = self.backbone_forward(batch.ids, batch.mask, gather, position_ids, keep_logits=pred)
        lm = F.cross_entropy(logits.flatten(0, 1), batch.labels[:, pred + 1].flatten(), ignore_index=-100)
        # T: chunk states then the thought shifted right; predict the thought from the chunk's last token on
        states = h[batch.t_row[:, None], batch.t_src.clamp(min=0)]  # [N, L, d] (chunk part)
        emb = self.embed(batch.t_tok.clamp(min=0))  # [N, L, d] (thought part)
        states = torch.where(batch.t_is_tok[..., None], emb, states) * batch.t_mask[..., None]
        sel = batch.t_target != -100  # [N, L] slots that predict a thought token
        tl = self.think_logits(states, batch.t_mask, select=sel)  # [k, vocab]
        th = F.cross_entropy(tl, batch.t_target[sel])
        return lm + th, {"lm": lm.item(), "thought": th.item()}

    def teacher_forced_logits(self, batch) -> torch.Tensor:
        """Backbone logits ``[B, T, V]`` with gold states (the parallel reference of inference)."""
        S = self.compress(batch.thought_ids, batch.thought_len)
        gather = S[batch.feed.clamp(min=0)] * (batch.feed >= 0)[..., None]
        return self.backbone_forward(batch.ids, batch.mask, gather)[0]

    def thinking_state_dict(self) -> dict:
        """T, C and the output projection (the backbone is saved with save_pretrained)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("backbone.")}


@forward_module.register(ThinkingStates)
def _refuse_the_backbone_alone(model) -> nn.Module:
    """The forward door (`models.forward.forward_module`) refuses a Thinking States model: its HF model alone
    answers without its thoughts."""
    raise ThoughtsSkippedError(
        f"{model.name_or_path!r} is a Thinking States model: this path runs its HF model directly, which answers "
        "without its thoughts. Decode it with beliefscope.decoding.thinking.run_thinking (what "
        f"`beliefscope generate --model {model.name_or_path}` runs), or call the model itself, model(ids), whose "
        "forward injects its thoughts")
