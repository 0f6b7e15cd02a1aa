"""Small viewer pages shared by the viewer's tests (built once per test process)."""

import functools


@functools.cache
def page(task: str = "coinflip"):
    """(data, page text) of a small page: two models side by side on coinflip (with a speculative
    decode), or thinking-cups on three cups (n-way states)."""
    import torch

    from beliefscope.analyses.view import ViewConfig, build
    from beliefscope.analyses.view_page import render

    torch.set_num_threads(1)
    if task == "coinflip":
        cfg = ViewConfig(models=("thinking", "target"), events="3-5", n=2, n_train=40, max_new_tokens=12)
    else:
        cfg = ViewConfig(models=("thinking-cups",), task="cups", events="2-3", n=1, n_train=30, decode="")
    data = build(cfg)
    return data, render(data)
