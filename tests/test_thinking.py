"""Thinking States: chunk-by-chunk cached inference against the parallel forward, thoughts dropped
from the context, the shipped checkpoint against its gold teacher-forced forward, bad input."""

import pytest
import torch

from beliefscope.decoding.thinking import run_thinking
from beliefscope.models.thinking import THOUGHT
from beliefscope.models.thinking.data import make_batch
from beliefscope.models.train_rope import RopeTrainConfig, build
from beliefscope.tasks import get_task


@pytest.fixture(scope="module")
def random_thinking():
    """A random Thinking States model whose states are not zero (so S really changes the forward)."""
    torch.manual_seed(0)
    model, tok = build(RopeTrainConfig(preset="thinking", d_model=32, n_layers=3, n_heads=4))
    torch.nn.init.normal_(model.out_proj.weight, std=0.2)
    return model.eval(), tok


@pytest.fixture(scope="module")
def thinking():
    from beliefscope.models import load_model

    return load_model("thinking")


@pytest.mark.parametrize("n_events", [1, 4, 9])
def test_cached_chunks_equal_parallel_forward_random(random_thinking, n_events):
    """The reference: the model's own thoughts settle S chunk index by chunk index (plain HF, one
    forward per chunk index), then one parallel forward. Cached inference through the bridge must
    write the same thoughts and give the same logits."""
    model, tok = random_thinking
    ex = get_task("coinflip").example(seed=n_events, n_events=n_events)
    ids = tok(ex.prompt)["input_ids"]
    run = run_thinking(model, ids, max_new_tokens=3, stop_at_eos=False)
    full = torch.tensor([ids + run.tokens[:-1]])
    add, thoughts = model.self_states(full)
    logits, _ = model.backbone_forward(full, None, add)
    assert thoughts[0] == run.thoughts
    assert len(run.thoughts) == n_events + 1  # the preamble and every event end a chunk
    assert (logits[0] - run.logits).abs().max() <= 1e-4
    assert float(add.abs().max()) > 0.1  # the states did change the forward


def test_thoughts_never_enter_the_context(random_thinking):
    model, tok = random_thinking
    ids = tok("A coin is heads . Alice flips . Bob stays . State ?")["input_ids"]
    run = run_thinking(model, ids, max_new_tokens=2, stop_at_eos=False)
    assert run.cache.seq_len == len(ids) + 1  # prompt + the fed-back answer token, no thought
    assert run.thought_cache.seq_len == 0  # every thought was rolled back
    written = [s for s in run.thought_cache.recorder.rejected if (s.provenance == THOUGHT).any()]
    assert len(written) == len(run.thoughts) >= 3  # the prompt's 3 chunks (+ one if the answer ends a chunk)
    kinds = [e.kind for e in run.thought_cache.recorder.events]
    assert kinds.count("rollback") == len(run.thoughts) and "thought" in kinds
    prov = run.cache.recorder.provenance_of(0)
    assert not (prov == THOUGHT).any()


def test_capture_sees_the_model_as_it_runs(random_thinking):
    """Calling the model (what harvest and probes do) injects its own states: a capture at L_in
    equals the residual stream of chunk-by-chunk inference, and differs from the bare backbone."""
    from beliefscope.hooks import capture

    model, tok = random_thinking
    ids = torch.tensor([tok("A coin is tails . Bob flips . Eve flips . State ?")["input_ids"]])
    name = f"blocks.{model.l_out}.hook_resid_post"
    with capture(model, [name]) as cap:
        model(ids, return_type=None)
    seen = cap.stacked(name)[0]  # [T, d]
    add, _ = model.self_states(ids)
    _, h = model.backbone_forward(ids, None, add)
    _, h0 = model.backbone_forward(ids, None, None)
    assert (seen - h[0]).abs().max() <= 1e-4
    assert (seen - h0[0]).abs().max() > 1e-2


def test_shipped_checkpoint_matches_gold_teacher_forcing(thinking):
    """On the trained model, when its thoughts equal the gold ones, cached chunk-by-chunk inference
    equals the teacher-forced parallel forward of training (gold thoughts -> gold states)."""
    model, tok = thinking
    checked = 0
    for seed in range(6):
        ex = get_task("coinflip").example(seed=seed, n_events=3 + seed)
        batch = make_batch([ex], tok, model.thinking_config)
        n = int(batch.n_prompt[0])
        run = run_thinking(model, batch.ids[0, :n].tolist(), max_new_tokens=1)
        gold = [tok.decode(t[: int(k)]) for t, k in zip(batch.thought_ids, batch.thought_len)]
        if [tok.decode(z) for _, z in run.thoughts] != gold:
            continue
        ref = model.teacher_forced_logits(batch)[0, :n]
        assert (ref - run.logits).abs().max() <= 1e-4
        checked += 1
    assert checked >= 5


def test_plain_loader_refuses_a_thinking_checkpoint_and_back(thinking):
    from beliefscope.models import ModelLoadError, load_hf
    from beliefscope.models.thinking.ckpt import load_thinking

    with pytest.raises(ModelLoadError, match="Thinking States checkpoint: load it with beliefscope.load_model"):
        load_hf("thinking")
    with pytest.raises(ModelLoadError, match="is not a Thinking States checkpoint"):
        load_thinking("target")


def test_too_long_prompt_fails_before_any_forward(random_thinking, monkeypatch):
    model, _ = random_thinking
    monkeypatch.setattr(type(model.bridge), "forward", lambda *a, **k: pytest.fail("ran a forward"))
    limit = model.backbone.config.max_position_embeddings
    with pytest.raises(ValueError, match=f"model addresses {limit}"):
        run_thinking(model, [3] * limit, max_new_tokens=4)


def test_remembered_states_equal_a_fresh_compress_and_follow_weight_edits():
    """S is remembered per distinct thought under no_grad: equal to C run on that thought alone,
    whatever shared the call; an in-place weight edit forgets it; with gradients it is computed."""
    model, tok = build(RopeTrainConfig(preset="thinking", n_layers=2, d_model=32, n_heads=2, seed=3))
    with torch.no_grad():
        torch.nn.init.normal_(model.out_proj.weight, std=0.5)  # S = 0 at start would make every check trivial
    h, t, e = (tok.convert_tokens_to_ids(w) for w in ("heads", "tails", tok.eos_token))
    thoughts = [[h, e], [t, e], [e], [h, e]]
    with torch.no_grad():
        alone = [model._compress_lists([z])[0] for z in thoughts]  # [d] each, no memo
        got = model.state_from_thoughts(thoughts)  # [4, d]
        assert all(torch.equal(got[i], alone[i]) for i in range(4))
        assert len(model._remembered_states()) == 3  # three distinct thoughts, each compressed once
        assert torch.equal(model.state_from_thoughts([[t, e]])[0], alone[1])
        model.out_proj.weight.mul_(2.0)  # in-place edit: the memo must not serve the old S
        assert torch.allclose(model.state_from_thoughts([[h, e]])[0], 2 * alone[0], atol=1e-6)
    s = model.state_from_thoughts([[h, e]])
    assert s.requires_grad  # training path: computed, differentiable


def test_a_cache_for_a_thinking_model_is_shaped_like_its_backbone_and_written(random_thinking):
    """`KVCache.for_model` on a Thinking States model (guarded by its constructor, as before the guard
    moved to the loaders): the backbone's shapes, and a cached forward over it writes every position."""
    from beliefscope.cache import KVCache

    model, tok = random_thinking
    ids = torch.tensor([tok("A coin is tails . Bob flips . State ?")["input_ids"]])
    cache = KVCache.for_model(model, capacity=64)
    assert cache.config.n_layers == model.backbone.config.num_hidden_layers
    with torch.no_grad():
        model(ids, past_key_values=cache, return_type="logits")
    assert cache.seq_len == ids.shape[1]


def test_the_forward_door_refuses_a_thinking_model_instead_of_skipping_its_thoughts(thinking):
    """Every decoding loop runs a model through `models.forward.forward_module`. Handed the shipped Thinking States
    model, it used to run the backbone alone: plain greedy answered "heads" where the model, reading its
    own thought after "Alice flips", answers "tails". The door now refuses, and names the path that reads it."""
    from beliefscope.decoding import NGramDrafter, SpecConfig, generate, speculative_generate
    from beliefscope.models.errors import ThoughtsSkippedError

    model, tok = thinking
    ids = tok("A coin is heads . Alice flips . State ?")["input_ids"]
    assert tok.convert_ids_to_tokens(run_thinking(model, ids, max_new_tokens=2).tokens) == ["tails", "<eos>"]
    backbone_alone = generate(model.bridge, ids, SpecConfig(max_new_tokens=2)).tokens  # what the loops ran
    assert tok.convert_ids_to_tokens(backbone_alone)[0] == "heads"
    for run in (lambda: generate(model, ids, SpecConfig(max_new_tokens=2)),
                lambda: speculative_generate(model, NGramDrafter(3), ids, SpecConfig(max_new_tokens=2))):
        with pytest.raises(ThoughtsSkippedError, match="'thinking' is a Thinking States model.*run_thinking"):
            run()
    logits = model(torch.tensor([ids]))  # its own forward injects the thoughts: the answer it decodes
    assert tok.convert_ids_to_tokens([int(logits[0, -1].argmax())]) == ["tails"]


def test_run_with_cache_and_hooks_see_the_forward_the_model_runs(thinking):
    """TransformerLens's run_with_cache / run_with_hooks on a Thinking States model used to reach the bridge
    and run the backbone without the thoughts (last-position logits 9.1 away). They now run its forward."""
    model, tok = thinking
    ids = torch.tensor([tok("A coin is heads . Alice flips . State ?")["input_ids"]])
    ref = model(ids)  # its own forward, thoughts injected: answers "tails"
    logits, cache = model.run_with_cache(ids, names_filter="blocks.1.hook_resid_post")
    seen = []
    hooked_logits = model.run_with_hooks(ids, fwd_hooks=[("blocks.1.hook_resid_post", lambda x, hook: seen.append(x))])
    for out in (logits, hooked_logits):
        assert torch.allclose(out, ref, atol=1e-4) and int(out[0, -1].argmax()) == int(ref[0, -1].argmax())
    assert torch.equal(seen[0], cache["blocks.1.hook_resid_post"])
    assert (model.bridge(ids) - ref).abs().max() > 1  # the backbone alone is another model
    from beliefscope.models.errors import ThoughtsSkippedError

    with pytest.raises(ThoughtsSkippedError, match="generate\\(\\) would decode its backbone without its thoughts"):
        model.generate(ids)
