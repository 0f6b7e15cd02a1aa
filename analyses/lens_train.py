"""`beliefscope lens-train`: fit a tuned lens (`probes.tuned_lens`) on your text or the shipped corpus, save it
with the model's checkpoint hash, and chart held-out KL per layer, tuned vs logit lens.

With ``--acts STORE`` (a `beliefscope harvest` store of this model, every block's ``resid_post``) it trains
from the stored residuals and runs no forward over the texts (`probes.tuned_lens_store`). Otherwise texts come
from ``--data``: a ``.txt`` file (one text per line), or records (``.jsonl``, ``.csv``, ... read
by `tasks.sources.read_rows`, their ``--text-field``). Without ``--data``, `tasks.corpus.shipped_texts`
gives ``--n`` texts fit for the model's tokenizer.

Usage (not run as a doctest: it trains on a model)::

    res = train_main(LensTrainConfig(model="target", out="runs/lens/target", steps=100))
    res["heldout_kl"]["tuned"]
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from ..models.load import load_model
from ..models.profile import model_profile
from ..probes.store import ActivationStore
from ..probes.tuned_lens import TunedLensConfig, check_config, train_tuned_lens
from ..probes.tuned_lens_store import train_tuned_lens_from_store
from ..tasks.corpus import shipped_texts
from ..tasks.sources import read_rows
from .common import check_writable_parent, save_fig
from .lens_plots import kl_figure


@dataclass
class LensTrainConfig(TunedLensConfig):
    """`beliefscope lens-train`: a tuned lens for one model."""

    model: str = "target"  # checkpoint folder or alias the lens is for (it is refused on any other)
    out: str = ""  # folder for tuned_lens.safetensors, tuned_lens.json and kl.png
    data: str = ""  # your texts: a .txt file (one text per line) or records (.jsonl/.csv/.parquet) ("": shipped corpus)
    text_field: str = "text"  # with record --data: the field holding the text
    n: int | None = None  # texts used (default: every text of --data; 200 of the shipped corpus)
    rendering: str | None = None  # shipped corpus: toy / natural (default: the model's own)
    acts: str = ""  # an activation store of this model (`beliefscope harvest --layers all`): train from its stored
    #   residuals, with no forward over the texts (instead of --data or the shipped corpus)


def texts_of(cfg: LensTrainConfig) -> list[str]:
    """The texts to train and hold out on, checked before any model loads."""
    if cfg.n is not None and cfg.n < 2:
        raise ValueError(f"--n {cfg.n}: a tuned lens needs at least 2 texts (one held out)")
    if not cfg.data:
        return shipped_texts(cfg.rendering or model_profile(cfg.model).rendering, cfg.n or 200, cfg.seed)
    if not os.path.exists(cfg.data):
        raise FileNotFoundError(f"--data {cfg.data} does not exist: pass a .txt file (one text per line) or records "
                                "(.jsonl/.csv) with a text field, or leave --data out for the shipped corpus")
    if cfg.data.endswith(".txt"):
        with open(cfg.data) as f:
            texts = [line.strip() for line in f if line.strip()]
    else:
        rows = read_rows(cfg.data)
        missing = [i for i, r in enumerate(rows) if not isinstance(r.get(cfg.text_field), str)]
        if missing:
            raise ValueError(f"record {missing[0]} of {cfg.data} has no text field {cfg.text_field!r}: pass "
                             "--text-field NAME")
        texts = [r[cfg.text_field] for r in rows]
    return texts[: cfg.n] if cfg.n else texts


def prepare(cfg: LensTrainConfig) -> LensTrainConfig:
    """Refuse bad values (naming the flag) before any work."""
    if not cfg.out:
        raise ValueError("--out is required: the folder the tuned lens is saved to")
    check_writable_parent(os.path.join(cfg.out, "tuned_lens.json"))
    check_config(cfg, max(2, cfg.n or 2))
    if cfg.acts and (cfg.data or cfg.n is not None):
        raise ValueError(f"--acts {cfg.acts} trains on the store's prompts: leave out --data and --n (harvest "
                         "the texts you want into the store)")
    if cfg.acts:
        ActivationStore.open(cfg.acts)  # a missing or unfinished store, refused before the model loads
    return cfg


def train_main(cfg: LensTrainConfig, *, model=None, tok=None, progress=None) -> dict:
    """Train, save and chart; returns the lens's metadata (its held-out KL table included) and the files."""
    prepare(cfg)
    tl = TunedLensConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(TunedLensConfig)})
    texts = [] if cfg.acts else texts_of(cfg)
    if not cfg.acts:
        check_config(tl, len(texts))
    if model is None:
        model, tok = load_model(cfg.model)
    if cfg.acts:
        lens = train_tuned_lens_from_store(model, cfg.acts, tl, name=cfg.model, progress=progress)
    else:
        lens = train_tuned_lens(model, tok, texts, tl, name=cfg.model, progress=progress)
    lens.save(cfg.out)
    kl = lens.meta["heldout_kl"]
    png = os.path.join(cfg.out, "kl.png")
    save_fig(kl_figure(kl["logit"], kl["tuned"], f"{cfg.model}: held-out KL to the final distribution "
                                                 f"({lens.meta['n_heldout_texts']} texts)"), png)
    files = [os.path.join(cfg.out, f) for f in ("tuned_lens.safetensors", "tuned_lens.json")] + [png]
    source = f"activation store {cfg.acts}" if cfg.acts else cfg.data or "shipped corpus"
    return {**lens.meta, "out": cfg.out, "source": source, "files": files}


def kl_lines(res: dict) -> list[str]:
    """The held-out KL table, one line per layer."""
    kl = res["heldout_kl"]
    head = (f"tuned lens of {res['model']}: {res['train_tokens']} training tokens from {res['n_train_texts']} texts, "
            f"{res['config']['steps']} steps in {res['train_seconds']} s ({'read' if res.get('store') else 'capture'} "
            f"{res['capture_seconds']} s); "
            f"{res['bytes'] / 1e6:.1f} MB")
    rows = [f"layer {i:>2}: logit {a:8.3f}  tuned {b:8.3f}" for i, (a, b) in enumerate(zip(kl["logit"], kl["tuned"]))]
    return [head, f"held-out KL(final || lens), nats, over {res['n_heldout_texts']} texts:", *rows,
            *[f"wrote {p}" for p in res["files"]]]
