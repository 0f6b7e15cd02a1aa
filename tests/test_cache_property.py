"""Property test: random append / rollback / fork sequences match from-scratch recomputation."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from beliefscope.cache import KVCache
from beliefscope.models.testing import tiny_gpt2

BRIDGE = tiny_gpt2(seed=7, n_layer=2, n_embd=16, n_head=2)
OPS = st.lists(
    st.tuples(st.sampled_from(["append", "rollback", "fork", "fork_at"]), st.integers(0, 10_000),
              st.integers(1, 3), st.booleans()),
    min_size=1, max_size=12,
)


@settings(max_examples=30, deadline=None)
@given(OPS, st.integers(1, 6))
def test_random_ops_match_reference(ops, prefill):
    g = torch.Generator().manual_seed(prefill)
    first = torch.randint(0, 50, (prefill,), generator=g).tolist()
    root = KVCache.for_model(BRIDGE, capacity=2)
    with torch.no_grad():
        BRIDGE(torch.tensor([first]), past_key_values=root, return_type="logits")
    states = [(root, first)]  # (cache, the tokens it holds)
    for kind, pick, n, masked in ops:
        i = pick % len(states)
        cache, toks = states[i]
        if kind == "append" and len(toks) + n <= 40:
            new = torch.randint(0, 50, (n,), generator=g).tolist()
            if not masked and not cache.is_clean:  # a hole (left by a masked write past a fork's slots):
                with pytest.raises(RuntimeError, match="forward_kwargs"):  # a plain forward must refuse...
                    with torch.no_grad():
                        BRIDGE(torch.tensor([new]), past_key_values=cache, return_type="logits")
                masked = True  # ...without side effects, and the masked forward then works
            kw = cache.forward_kwargs(n) if masked else {"past_key_values": cache}
            with torch.no_grad():
                out = BRIDGE(torch.tensor([new]), return_type="logits", **kw)
                want = BRIDGE(torch.tensor([toks + new]), return_type="logits")[:, len(toks):]
            assert (out - want).abs().max() <= 1e-4
            states[i] = (cache, toks + new)
        elif kind == "rollback":
            to = pick % (len(toks) + 1)
            cache.rollback(to)
            states[i] = (cache, toks[:to])
        elif kind in ("fork", "fork_at"):
            at = len(toks) if kind == "fork" else pick % (len(toks) + 1)
            states.append((cache.fork(at=at), toks[:at]))
        for c, t in states:  # every live cache still holds exactly its tokens' K/V
            assert c.seq_len == len(t)
    # final check of every state's stored keys against a fresh cache built on its tokens
    for c, t in states:
        if not t:
            continue
        fresh = KVCache.for_model(BRIDGE)
        with torch.no_grad():
            BRIDGE(torch.tensor([t]), past_key_values=fresh, return_type="logits")
        for layer in range(2):
            assert (c.keys(layer) - fresh.keys(layer)).abs().max() <= 1e-4
            assert (c.values(layer) - fresh.values(layer)).abs().max() <= 1e-4
