"""Shipped checkpoints (package data): toy models trained here and the SmolLM2 n-gram store.

Reach them by name with ``beliefscope.models.checkpoint_path("target")``; each folder has a
``model_card.json`` saying how it was trained and how to rebuild it.
"""
