"""`beliefscope train` on the RoPE presets is resumable: a run killed between checkpoints and started
again ends with the weights, history and card of an uninterrupted run (reference: the straight run)."""

from __future__ import annotations

import os

import pytest
import torch

from beliefscope.models.train_rope import RopeTrainConfig, train_rope
from beliefscope.models.train_state import STATE_FILE


class Stop(Exception):
    pass


def _cfg(preset="thinking", **kw):
    return RopeTrainConfig(**{"preset": preset, "steps": 5, "batch_size": 4, "eval_n": 0, "d_model": 32,
                              "n_layers": 2, "warmup": 2, "log_every": 1, "checkpoint_every": 2, **kw})


@pytest.mark.parametrize("preset", ["thinking", "cot-rope"])
def test_killed_rope_run_resumes_to_the_uninterrupted_weights(preset, tmp_path):
    straight, _, ref = train_rope(_cfg(preset))
    out = str(tmp_path / "run")

    def kill_at_3(rec):
        if rec.get("step") == 3:  # dies after step 3; the last state saved is step 2's
            raise Stop

    with pytest.raises(Stop):
        train_rope(_cfg(preset), out, progress=kill_at_3)
    assert os.listdir(out) == [STATE_FILE]
    seen = []
    model, _, card = train_rope(_cfg(preset, threads=1, log_every=1), out, progress=seen.append)
    assert seen[0] == {"resumed_from": 2} and [r["step"] for r in seen[1:]] == [3, 4, 5]
    assert [h["loss"] for h in card["history"]] == [h["loss"] for h in ref["history"]]
    mine = dict(model.named_parameters())
    for name, p in straight.named_parameters():
        assert torch.equal(p, mine[name]), name
    assert STATE_FILE not in os.listdir(out) and "model_card.json" in os.listdir(out)  # the finished checkpoint


def test_rope_resume_with_other_settings_is_refused(tmp_path):
    out = str(tmp_path / "run")
    with pytest.raises(Stop):
        train_rope(_cfg(), out, progress=lambda r: (_ for _ in ()).throw(Stop) if r.get("step") == 3 else None)
    with pytest.raises(ValueError, match=r"lr: saved 0.001, now 0.002.*another --out"):
        train_rope(_cfg(lr=2e-3), out)
