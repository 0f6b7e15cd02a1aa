"""Provenance of a speculative run says what happened (issue 60, silent case 1): a drafted token the verifier
accepted (ACCEPTED), a token the verifier chose (VERIFIED), a rejected draft (REJECTED, in ``cache.recorder.rejected``),
and never the padding of a fixed-shape verify window, in the cache, the trace or a capture."""

import pytest
import torch

from beliefscope.cache import Provenance
from beliefscope.decoding import ModelDrafter, SpecConfig, TreeConfig, generate, speculative_generate
from beliefscope.decoding.core import hf_model
from beliefscope.models.load import load_model

from .helpers import DRAFT, TARGET, toy_hf

pytestmark = pytest.mark.usefixtures("one_thread")

NAME = "blocks.0.hook_resid_post"


def expected_labels(out, n_prompt: int) -> list[int]:
    """Labels of the cache's positions from the trace alone: the prompt, then per step the accepted drafts
    (ACCEPTED) and the verifier's own token (VERIFIED; the first one is the prefill's pick)."""
    labels = [int(Provenance.PREFILL)] * n_prompt + [int(Provenance.VERIFIED)]
    for s in out.trace.steps:
        labels += [int(Provenance.ACCEPTED)] * (len(s.committed) - 1) + [int(Provenance.VERIFIED)]
    return labels[: n_prompt + len(out.tokens) - 1]  # the last committed token is pending (not in the cache)


def test_chain_provenance_rejected_and_captures_hold_no_padding(heldout_prompts):
    target, _ = load_model(TARGET)
    hf = hf_model(target)
    cfg = SpecConfig(gamma=4, max_new_tokens=20, stop_at_eos=False, keep_rejected=True, trace=True, capture=(NAME,))
    checked = 0
    for p in heldout_prompts[:4]:
        out = speculative_generate(target, ModelDrafter(toy_hf("draft", DRAFT)), p, cfg)
        assert out.tokens == generate(target, p, cfg).tokens  # plain greedy
        n_rejected = sum(len(s.rejected) for s in out.trace.steps)
        n_accepted = sum(len(s.committed) - 1 for s in out.trace.steps)
        cache = out.cache
        assert cache.seq_len == len(p) + len(out.tokens) - 1
        # cache.recorder.rejected: the rejected drafts and nothing else, each with the K/V an uncached forward gives it
        assert sum(s.end - s.start for s in cache.recorder.rejected) == n_rejected
        assert all((s.provenance == Provenance.REJECTED).all() for s in cache.recorder.rejected)
        assert f"{n_rejected:>9}" in cache.recorder.summary().splitlines()[2]  # the REJECTED column
        spans = iter(cache.recorder.rejected)
        for s in (s for s in out.trace.steps if s.rejected):
            span = next(spans)
            prefix = (list(p) + out.tokens)[: s.position + 1 + s.accepted]
            assert (span.start, span.end) == (len(prefix), len(prefix) + len(s.rejected))
            full = hf(torch.tensor([prefix + s.rejected]), use_cache=True).past_key_values
            torch.testing.assert_close(span.keys[0], full.layers[0].keys[0, :, len(prefix):], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(span.values[1], full.layers[1].values[0, :, len(prefix):], atol=1e-5, rtol=1e-5)
        # the trace: rolled-back positions are the rejected drafts; committed ones cover the decoded positions
        pos, acts = out.trace.activations(NAME, status="rolled_back")
        assert len(pos) == n_rejected
        pos, _ = out.trace.activations(NAME, status="committed")
        assert sorted(set(pos.tolist())) == list(range(len(p), cache.seq_len))
        # the capture's stacked view is the committed sequence: an uncached forward's hidden states
        stacked = out.trace.captures[0].stacked(NAME)
        assert stacked.shape[1] == cache.seq_len
        ref = hf(torch.tensor([list(p) + out.tokens[:-1]]), output_hidden_states=True).hidden_states[1]
        torch.testing.assert_close(stacked, ref, atol=1e-4, rtol=1e-4)
        # the live labels: the verifier's own tokens VERIFIED, the accepted drafts ACCEPTED
        assert cache.recorder.provenance_of(0).tolist() == expected_labels(out, len(p))
        assert int((cache.recorder.provenance_of(0) == Provenance.ACCEPTED).sum()) == n_accepted
        checked += n_rejected > 0
    assert checked  # some prompt had rejected drafts


def test_padding_of_fixed_shape_reference_is_never_rejected(heldout_prompts):
    target, _ = load_model(TARGET)
    p = heldout_prompts[0]
    cfg = SpecConfig(gamma=4, max_new_tokens=8, stop_at_eos=False, keep_rejected=True, trace=True, capture=(NAME,))
    out = generate(target, p, cfg, window=cfg.window_size)  # every forward: the pending token, then padding
    assert out.cache.recorder.rejected == []
    want = [0] * len(p) + [int(Provenance.VERIFIED)] * (len(out.tokens) - 1)
    assert out.cache.recorder.provenance_of(0).tolist() == want
    assert len(out.trace.activations(NAME, status="rolled_back")[0]) == 0
    assert out.trace.captures[0].stacked(NAME).shape[1] == out.cache.seq_len


def test_tree_rejected_spans_hold_nodes_only(toy, heldout_prompts):
    target, draft, _ = toy
    cfg = SpecConfig(max_new_tokens=16, stop_at_eos=False, tree=TreeConfig(nodes=6, depth=3),
                     keep_rejected=True, trace=True)
    for p in heldout_prompts[:3]:
        out = speculative_generate(target, ModelDrafter(draft), p, cfg)
        assert out.tokens == generate(target, p, cfg).tokens
        kept = sum(s.end - s.start for s in out.cache.recorder.rejected)
        assert kept == sum(len(s.rejected) for s in out.trace.steps)
        assert all(len(s.rejected_order) == len(s.rejected) for s in out.trace.steps)
        assert out.cache.recorder.provenance_of(0).tolist() == expected_labels(out, len(p))
