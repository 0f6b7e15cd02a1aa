"""The `Runner` class: a plain model and a Thinking States model are run, hooked and captured the same way,
and the forward door (`models.forward.forward_module`) serves the one and refuses the other."""

import pytest
import torch

from beliefscope.decoding.core import hf_logits
from beliefscope.models import Runner, load_model, model_shapes, writes_thoughts
from beliefscope.models.errors import ThoughtsSkippedError

PROMPT = "A coin is heads . Alice flips . Bob stays . State ?"


@pytest.fixture(scope="module", params=["target", "thinking"])
def runner(request):
    return load_model(request.param, device="cpu")


def test_both_kinds_are_runners_with_one_surface(runner):
    model, tok = runner
    assert isinstance(model, Runner)
    ids = torch.tensor([tok(PROMPT)["input_ids"]])  # [1, pos]
    name = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    with torch.no_grad():
        ref = model(ids)  # [1, pos, d_vocab]: the forward the model runs
        logits, cache = model.run_with_cache(ids, names_filter=name)
        seen = []
        hooked = model.run_with_hooks(ids, fwd_hooks=[(name, lambda x, hook: seen.append(x))])
    assert ref.shape == (1, ids.shape[1], model.cfg.d_vocab)
    for out in (logits, hooked):  # the capture and the hooks see the forward the model runs
        assert torch.allclose(out, ref, atol=1e-4)
    assert torch.equal(seen[0], cache[name])
    assert model_shapes(model).n_layers == model.cfg.n_layers


def test_the_door_serves_a_bridge_and_refuses_a_thinking_model(runner):
    """hf_logits is the hot loops' forward (through `models.forward.forward_module`): a bridge's logits there are its
    forward's; a Thinking States model is refused rather than run without its thoughts."""
    model, tok = runner
    ids = torch.tensor([tok(PROMPT)["input_ids"]])
    if writes_thoughts(model):
        with pytest.raises(ThoughtsSkippedError, match="run_thinking"):
            hf_logits(model, ids)
        return
    with torch.no_grad():
        assert torch.allclose(hf_logits(model, ids), model(ids), atol=1e-5)


def test_a_thinking_models_twin_holds_the_backbones_parameters_through_moves_and_checkpoints():
    """ThinkingStates runs hooks on a twin of its backbone (models.thinking.twin.twin_of): the same Parameter
    objects, so a dtype move or a training step reaches both, and a state dict neither holds nor needs the
    twin's entries (it loads back in full)."""
    import copy

    model, tok = load_model("thinking", device="cpu")
    model = copy.deepcopy(model)
    assert all(a is b for a, b in zip(model.hf.parameters(), model.backbone.parameters(), strict=True))
    state = model.state_dict()
    assert state and not any(k.startswith("hf.") for k in state)
    assert not model.load_state_dict(state, strict=True).missing_keys
    ids = torch.tensor([tok(PROMPT)["input_ids"]])
    with torch.no_grad():
        ref = model(ids).double()
        model.to(torch.float64)
        assert all(a is b for a, b in zip(model.hf.parameters(), model.backbone.parameters(), strict=True))
        assert {b.dtype for b in model.hf.buffers() if b.is_floating_point()} <= {torch.float64}
        assert torch.allclose(model(ids), ref, atol=1e-4)  # float32 vs float64 of the same weights
