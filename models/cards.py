"""Model cards: the JSON a checkpoint folder keeps beside its weights (``model_card.json``)."""

from __future__ import annotations

import json
import os

from .names import checkpoint_path


def read_card(path: str) -> dict:
    """A checkpoint folder's ``model_card.json`` as a dict ({} when it has none): the one card reader."""
    f = os.path.join(path, "model_card.json")
    if not os.path.isfile(f):
        return {}
    with open(f) as fh:
        card = json.load(fh)
    return card if isinstance(card, dict) else {}


def checkpoint_sha256(name: str) -> str | None:
    """The ``model_sha256`` of a checkpoint's model card (None: a hub name or a card without one), so a
    result names the exact checkpoint it was measured on."""

    folder = checkpoint_path(name, must_exist=False)
    return read_card(folder).get("model_sha256") if folder else None
