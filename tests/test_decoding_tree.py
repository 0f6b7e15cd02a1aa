"""Token-tree speculative decoding: greedy exactness against the fixed-shape reference on 200 toy
prompts for every drafter that builds trees, path relocation in the cache, REJECTED provenance,
bad input, the tree mask, and the tree shape chosen from acceptance statistics."""

import pytest
import torch

from beliefscope.cache import KVCache, Provenance
from beliefscope.decoding import (
    Drafter,
    EarlyExitDrafter,
    ModelDrafter,
    NGramDrafter,
    SpecConfig,
    TokenTree,
    TreeConfig,
    generate,
    speculative_generate,
)
from beliefscope.decoding.tree import tree_forward_kwargs

from .helpers import guarded, tiny_gpt2_hf, tiny_llama_hf

pytestmark = pytest.mark.usefixtures("one_thread")


class SideBranchOracle(Drafter):
    """Test double: a tree whose *first* branch is wrong at depth 1 and whose second branch holds the
    reference continuation (with a wrong sibling at depth 2), so the accepted path is never the
    first slots: its K/V must be moved."""

    name = "oracle"

    def __init__(self, reference, vocab):
        self.ref, self.vocab = reference, vocab

    def start(self, target, ids, cache, cfg):
        self.n0 = ids.numel() - 1  # ref[0] is the prefill's token, already committed

    def propose_tree(self, ids, shape, cfg):
        done = ids.numel() - self.n0
        r = (self.ref + [3] * 8)[done:done + 3]
        w = [(t + 1) % self.vocab for t in r]
        return TokenTree([w[0], r[1], r[0], w[1], r[1], r[2]], [-1, 0, -1, 2, 2, 4])


def toy_store(target, tok):
    """A store of the toy target's own greedy outputs on train-split prompts (disjoint from the held-out ones)."""
    from beliefscope.decoding.datastore import NGramStore, StoreDrafter
    from beliefscope.decoding.store_build import StoreBuildConfig, greedy_outputs
    from beliefscope.tasks import get_task

    exs = get_task("coinflip", fmt="cot", split="train").examples(40, seed=7, events=(1, 8))
    prompts = [tok(e.prompt)["input_ids"] for e in exs]
    store = NGramStore(4, {"vocab_size": target.config.vocab_size})
    for p, o in zip(prompts, greedy_outputs(target, prompts, StoreBuildConfig(max_new_tokens=20, batch_size=20))):
        store.add(p + o)
    return StoreDrafter(store, name="store:toy")


@pytest.mark.slow
def test_tree_greedy_exact_200_toy_prompts(toy, heldout_prompts):
    """Every drafter that builds trees, 200 held-out prompts: equal to the fixed-shape reference."""
    target, draft, tok = toy
    cfg = SpecConfig(max_new_tokens=20, tree=TreeConfig(nodes=8, depth=5, branch=3, min_share=0.0))
    ref = [generate(target, p, cfg, window=cfg.window_size, tokenizer=tok).tokens for p in heldout_prompts]
    drafters = [ModelDrafter(draft), EarlyExitDrafter(target, 2), NGramDrafter(3), toy_store(target, tok)]
    for d in drafters:
        outs = [speculative_generate(target, d, p, cfg, tokenizer=tok) for p in heldout_prompts]
        bad = [i for i, (o, r) in enumerate(zip(outs, ref)) if o.tokens != r]
        assert not bad, f"{d.name}: prompts {bad[:5]} differ from the fixed-shape reference"
        assert sum(o.steps for o in outs) < sum(len(r) for r in ref), f"{d.name} never accepted a draft"
        assert max(max(o.tree_nodes, default=0) for o in outs) > 1


def test_tree_drafters_branch_and_leave_the_main_chain(toy, heldout_prompts):
    """The draft model's trees have side leaves, and some accepted paths leave the main chain."""
    target, draft, tok = toy
    cfg = SpecConfig(max_new_tokens=20, tree=TreeConfig(nodes=8, depth=5, branch=3, min_share=0.0), trace=True)
    off_chain = branched = 0
    for p in heldout_prompts[:40]:
        out = speculative_generate(target, ModelDrafter(draft), p, cfg, tokenizer=tok)
        for s in out.trace.steps:
            branched += any(q != i - 1 for i, q in enumerate(s.tree_parents))  # not a plain chain
            off_chain += s.path != list(range(len(s.path)))
    assert branched > 0 and off_chain > 0
    assert off_chain > 0


@pytest.mark.parametrize("make", [tiny_gpt2_hf, tiny_llama_hf])
@pytest.mark.parametrize("keep_rejected", [False, True])
def test_side_branch_path_is_relocated(make, keep_rejected):
    """GPT-2 (learned positions) and Llama (RoPE): the accepted path sits in a side branch, is moved next
    to the prefix, and the cache then equals plain greedy's cache; rejected nodes keep REJECTED provenance."""
    model = make(seed=3)
    p = [5, 9, 11, 3, 4]
    cfg = SpecConfig(max_new_tokens=16, stop_at_eos=False, tree=TreeConfig(nodes=6, depth=3),
                     keep_rejected=keep_rejected, trace=True)
    ref = generate(model, p, cfg, window=cfg.window_size)
    out = speculative_generate(model, SideBranchOracle(ref.tokens, model.config.vocab_size), p, cfg)
    assert out.tokens == ref.tokens
    assert out.tokens_per_step[:3] == [4, 4, 4]  # depth-3 path in the second branch + the next token
    assert all(s.path[0] == 2 for s in out.trace.steps[:3])  # the second root child, not slot 1
    n = out.cache.seq_len
    assert n == ref.cache.seq_len
    for layer in range(model.config.num_hidden_layers):
        assert torch.allclose(out.cache.keys(layer), ref.cache.keys(layer)[:, :n], atol=1e-5)
        assert torch.allclose(out.cache.values(layer), ref.cache.values(layer)[:, :n], atol=1e-5)
    prov = out.cache.recorder.provenance_of(0)
    assert (prov[: len(p)] == Provenance.PREFILL).all()
    drafted = {s.position + 1 + j for s in out.trace.steps for j in range(len(s.committed) - 1)}  # accepted nodes
    assert all(int(c) == (Provenance.ACCEPTED if i in drafted else Provenance.VERIFIED)
               for i, c in enumerate(prov.tolist()) if i >= len(p))
    if keep_rejected:
        step0 = out.cache.recorder.rejected[0]
        assert step0.end - step0.start == 6 - 3  # 6 nodes drafted, 3 accepted: 3 rolled back
        assert (step0.provenance == Provenance.REJECTED).all()
        assert out.trace.steps[0].rejected_order == [0, 1, 3]  # the first branch and the wrong sibling
        # the kept entries are the rejected nodes' own K/V: node 0 (wrong depth-1 token) from an uncached forward
        full = model(torch.tensor([p + ref.tokens[:1] + [out.trace.steps[0].proposals[0]]]), use_cache=True)
        k0 = full.past_key_values.layers[0].keys[0, :, -1]  # [kv_heads, d_head]
        assert torch.allclose(step0.keys[0][:, 0], k0, atol=1e-5)
    else:
        assert out.cache.recorder.rejected == []


def test_tree_mask_and_positions():
    """Each node sees the prefix, the pending token and its ancestors; positions go by depth."""
    model = tiny_gpt2_hf()
    cache = KVCache.for_model(model, capacity=32)
    model(torch.tensor([[1, 2, 3]]), past_key_values=cache)
    tree = TokenTree([7, 8, 9], [-1, 0, -1])
    kw = tree_forward_kwargs(cache, tree, 5, model)
    m = kw["attention_mask"][0, 0].int().tolist()  # [5, 3 + 5]
    assert m[0] == [1, 1, 1, 1, 0, 0, 0, 0]
    assert m[2] == [1, 1, 1, 1, 1, 1, 0, 0]  # node 1 (token 8): root, node 0, itself
    assert m[3] == [1, 1, 1, 1, 0, 0, 1, 0]  # node 2 (token 9): root and itself, not node 0's branch
    assert kw["position_ids"].tolist() == [[3, 4, 5, 4, 4]]


def test_bad_input_refused_before_forward():
    with pytest.raises(ValueError, match="node 1 has parent 2, which comes after it"):
        TokenTree([4, 5, 6], [-1, 2, 0])
    model = tiny_gpt2_hf()
    cache = KVCache.for_model(model, capacity=8)
    model(torch.tensor([[1, 2, 3, 4, 5]]), past_key_values=cache)
    with pytest.raises(ValueError, match=r"free room of 3 positions \(capacity 8"):
        tree_forward_kwargs(cache, TokenTree.chain([1, 2, 3, 4]), 5, model)
    assert cache.seq_len == 5 and len(cache.recorder.events) == 1  # nothing was written
    # a tree deeper than the model's context (n_positions=256): refused, naming the limit
    from transformers import GPT2Config, GPT2LMHeadModel

    small = guarded(GPT2LMHeadModel(GPT2Config(vocab_size=16, n_positions=8, n_embd=8, n_layer=1, n_head=1)))
    cache = KVCache.for_model(small, capacity=64)
    small(torch.tensor([[1, 2, 3, 4, 5]]), past_key_values=cache)
    with pytest.raises(ValueError, match="model's context of 8 tokens"):
        tree_forward_kwargs(cache, TokenTree.chain([1, 2, 3]), 4, small)
    with pytest.raises(ValueError, match=r"TreeConfig.nodes=0"):
        TreeConfig(nodes=0)


def test_lookup_tree_single_occurrence_is_the_chain():
    """With one earlier occurrence the n-gram tree is exactly the chain drafter's draft."""
    ids = torch.tensor([3, 4, 5, 6, 7, 8, 3, 4])
    d = NGramDrafter(2)
    d.start(tiny_gpt2_hf(), ids, None, SpecConfig())
    chain = d.propose(ids, 4, SpecConfig())[0].tolist()
    tree = d.propose_tree(ids, TreeConfig(nodes=4, depth=4), SpecConfig())
    assert tree.tokens == chain and tree.parents == [-1, 0, 1, 2]


def test_choose_tree_nodes_maximises_tokens_per_cost():
    from beliefscope.decoding.tune import choose_tree_nodes

    # every step accepted the nodes of rank 0 and 5: a tree of <= 5 nodes accepts 1, of >= 6 nodes 2
    ranks = [[0, 5]] * 10
    cheap = {w: 1.0 for w in range(1, 12)}
    assert choose_tree_nodes(ranks, cheap, max_nodes=10)[0] == 6  # the smallest tree that catches rank 5
    steep = {w: 1.0 + 0.5 * (w - 1) for w in range(1, 12)}
    assert choose_tree_nodes(ranks, steep, max_nodes=10)[0] == 1  # width is too expensive: 2/1.5 > 3/4


@pytest.mark.parametrize("tree", [False, True])
def test_a_draft_models_own_cache_is_kept_by_the_engine_as_a_fresh_prefill_of_the_committed_tokens(tree):
    """The engine settles the drafter's own cache beside the target's (ModelDrafter.keep): after every step, and
    at the end, it holds a prefix of the committed tokens whose keys equal a fresh uncached prefill of that prefix
    (the reference), even where a tree's accepted path left the chain the draft model was fed. The output is
    plain greedy's. A draft model with other weights than the target's makes rejections and branch switches."""
    from beliefscope.decoding import generate

    target, draft = guarded(tiny_llama_hf(seed=0)), guarded(tiny_llama_hf(seed=1))
    prompt = [3, 4, 5, 6, 7, 3, 4]
    shape = TreeConfig(nodes=6, depth=3, min_share=0.0) if tree else None
    cfg = SpecConfig(gamma=3, max_new_tokens=16, stop_at_eos=False, tree=shape)
    d = ModelDrafter(draft)
    out = speculative_generate(target, d, prompt, cfg)
    assert out.tokens == generate(target, prompt, SpecConfig(max_new_tokens=16, stop_at_eos=False)).tokens
    committed = prompt + out.tokens
    n = d.cache.seq_len
    assert 0 < n <= len(committed) - 1 and d._fed == committed[:n]
    fresh = KVCache.for_model(draft, capacity=64)
    with torch.no_grad():
        draft(torch.tensor([committed[:n]]), past_key_values=fresh, use_cache=True)
    for layer in range(fresh.config.n_layers):
        assert (d.cache.keys(layer) - fresh.keys(layer)).abs().max() < 1e-5
