"""Models a user brings that cannot work are refused from the command line with one clear line, no
traceback and nothing on disk: non-causal models, folders without weights or a tokenizer, a tokenizer
larger than the embedding, a drafter dtype the architecture cannot run."""

from __future__ import annotations

import os

import pytest
import torch

from beliefscope.cli import main
from beliefscope.models.tokenizer import toy_tokenizer

from .helpers import tiny_llama_hf


def _bert(folder):
    from transformers import BertConfig, BertForMaskedLM

    BertForMaskedLM(BertConfig(vocab_size=32, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                               intermediate_size=64)).save_pretrained(folder)
    toy_tokenizer().save_pretrained(folder)


def _no_weights(folder):
    tiny_llama_hf(vocab=32).config.save_pretrained(folder)
    toy_tokenizer().save_pretrained(folder)


def _no_tokenizer(folder):
    tiny_llama_hf(vocab=32).save_pretrained(folder)


def _small_embedding(folder):
    tiny_llama_hf(vocab=16).save_pretrained(folder)
    toy_tokenizer().save_pretrained(folder)


CASES = [(_bert, "BertForMaskedLM, not a causal"), (_no_weights, "no weights"), (_no_tokenizer, "no tokenizer"),
         (_small_embedding,
          f"the tokenizer has {len(toy_tokenizer())} tokens but the model's embedding has only 16 rows")]


@pytest.mark.parametrize("make,fragment", CASES, ids=[c[0].__name__ for c in CASES])
@pytest.mark.parametrize("command", ["eval --task coinflip --n 2 --events 1-2",
                                     "harvest --n 2 --events 1-2 --out acts"])
def test_folder_refused(make, fragment, command, tmp_path, monkeypatch, capsys):
    folder = tmp_path / "m"
    make(str(folder))
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(tmp_path))
    argv = [command.split()[0], "--model", str(folder), *command.split()[1:]]
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert fragment in err.splitlines()[-1], err
    assert sorted(os.listdir(tmp_path)) == before  # nothing written


@pytest.mark.parametrize("arch", ["Falcon", "OLMo2"])
def test_bf16_drafter_runs_the_hf_model_and_is_refused_by_name_through_the_bridge(arch):
    """HF's Falcon and OLMo2 run in bfloat16; TransformerLens's wrappers keep float32 paths in them. So the
    drafter (a bfloat16 copy of the target's HF model) runs while no hook name has built the bridge, and is
    refused by name once the copied model carries the wrappers."""
    from beliefscope.decoding import make_drafter
    from beliefscope.models.runner import Runner

    from .architectures import make_hf

    runner = Runner(make_hf(arch))
    assert make_drafter("bf16", runner).model.dtype == torch.bfloat16
    _ = runner.bridge
    with pytest.raises(ValueError, match=f"--drafter bf16: {type(runner.original_model).__name__} does not run"):
        make_drafter("bf16", runner)


def test_bf16_drafter_still_runs_where_it_can():
    from beliefscope.decoding import make_drafter
    from beliefscope.models.testing import tiny_llama

    assert make_drafter("bf16", tiny_llama()).model.dtype == torch.bfloat16
