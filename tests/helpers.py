"""Helpers the test modules share: paths of the shipped toy checkpoints, tiny random HF models built
from config (no network), and the small exact models of the sampling tests. Fixtures live in
``conftest.py``; test modules import these with ``from .helpers import ...``."""

import itertools
import os
import shutil

import torch

from beliefscope.models import guard

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.path.join(ROOT, "checkpoints", "coinflip-target")
DRAFT = os.path.join(ROOT, "checkpoints", "coinflip-draft")
VOCAB = 5  # tokens of `sharp_model`


def guarded(hf):
    """``hf`` in eval mode with the cache guard `load_model` installs (``KVCache.for_model`` needs it)."""
    guard(hf)
    return hf.eval()


def tiny_llama_hf(seed=0, vocab=64):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return guarded(LlamaForCausalLM(cfg))


def tiny_gpt2_hf(seed=0, vocab=64):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=vocab, n_positions=256, n_embd=32, n_layer=2, n_head=4,
                     bos_token_id=1, eos_token_id=1)
    return guarded(GPT2LMHeadModel(cfg))


def copy_of(hf):
    """An independent HF model with the same weights (the bridge modifies its model in place)."""
    other = type(hf)(hf.config)
    other.load_state_dict(hf.state_dict())
    return guarded(other)


def toy_hf(preset, path):
    """The shipped toy checkpoint as a raw HF model (fast), or a random one of the same shape."""
    from transformers import GPT2LMHeadModel

    from beliefscope.models.load import load_hf
    from beliefscope.models.train import TrainConfig

    if os.path.exists(os.path.join(path, "config.json")):
        return load_hf(path)[0]
    torch.manual_seed(0)
    return guarded(GPT2LMHeadModel(TrainConfig(preset=preset).model_config(vocab_size=32)))


def sharp_model(seed):
    """A 1-layer GPT-2 with 5 tokens whose next-token distributions are far from uniform."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=16, n_layer=1, n_head=2, initializer_range=0.5)
    return guarded(GPT2LMHeadModel(cfg))


def exact_joint(model, prompt, temperature, n=3):
    """P(next n tokens) for every sequence, from uncached forwards."""
    seqs = list(itertools.product(range(VOCAB), repeat=n))
    ids = torch.tensor([prompt + list(s) for s in seqs])  # [V^n, len]
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits.double() / temperature, -1)
    L = len(prompt)
    lp = sum(logp[torch.arange(len(seqs)), L - 1 + j, ids[:, L + j]] for j in range(n))
    return seqs, lp.exp().numpy()


def logit_table(model, prompt, n):
    """Logits after ``prompt + s`` for every continuation s of length 0..n-1 (uncached, exact)."""
    out = {}
    with torch.no_grad():
        for k in range(n):
            for s in itertools.product(range(VOCAB), repeat=k):
                out[s] = model(torch.tensor([prompt + list(s)])).logits[0, -1].double()
    return out


def chi2_p(samples, seqs, p):
    """Chi-square p-value of the samples' counts against probabilities ``p`` of ``seqs`` (rare cells pooled)."""
    import numpy as np
    from scipy.stats import chisquare

    index = {s: i for i, s in enumerate(seqs)}
    counts = np.bincount([index[tuple(s)] for s in samples], minlength=len(seqs))
    exp = p * len(samples)
    big = exp >= 5
    obs, exp = counts[big], exp[big]
    if (~big).any():
        obs, exp = np.append(obs, counts[~big].sum()), np.append(exp, (p * len(samples))[~big].sum())
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


def browser_parts():
    """``((chrome, chromedriver), "")`` for the headless-browser tests, or ``(None, why they skip)``."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return None, "the selenium package is not installed (pip install selenium)"
    chrome = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if not chrome or not driver:
        return None, "no chromium / chromedriver on PATH (Debian: apt-get install chromium chromium-driver)"
    return (chrome, driver), ""
