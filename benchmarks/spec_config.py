"""What the speculative-decoding benchmark (``benchmarks.spec``) runs: its configuration, full and quick."""

from __future__ import annotations

from dataclasses import dataclass

TOY_DRAFTERS = ("draft", "early-exit:1", "early-exit:2", "early-exit:3", "ngram:3", "bf16")
SMOLLM2_DRAFTERS = ("early-exit:16", "early-exit:22", "early-exit:26", "ngram:3", "store:smollm2", "bf16")


@dataclass
class SpecBenchConfig:
    """What the speculative-decoding benchmark runs."""

    n_prompts: int = 32  # prompts per model (each one is a paired repeat)
    max_new_tokens: int = 64  # tokens generated per prompt (eos ignored, so every method makes exactly this many)
    gammas: tuple = (4, "auto")  # gamma settings run for every drafter
    toy_drafters: tuple = TOY_DRAFTERS  # drafters run on the toy target, each at every gamma of `gammas`
    toy_variable: tuple = (("ngram:3", 7), ("draft", "auto"))  # (drafter, gamma) also run with variable windows
    smollm2_drafters: tuple = SMOLLM2_DRAFTERS  # drafters run on SmolLM2 (gammas: the smollm2_* fields below)
    smollm2_auto_gamma: tuple = ("early-exit:16", "early-exit:22", "early-exit:26")  # also run with gamma="auto"
    smollm2_fixed_gamma: tuple = ("ngram:3", "store:smollm2", "bf16", "early-exit:26")  # also run with the fixed gamma
    smollm2_variable: tuple = (("ngram:3", 7), ("ngram:3", "auto"), ("store:smollm2", 7), ("store:smollm2", 9),
                               ("store:smollm2", 11), ("store:smollm2", "auto"))
    # (drafter, gamma) also run with fixed_window=False: each verify is as wide as its draft, padded up to the
    # widths this machine runs fastest (measured at the start with decoding.tune.measure_verify_widths)
    max_verify_width: int = 9  # widths 1..this are timed to pick the efficient ones
    stop_at_eos: bool = True  # stop at eos (every method makes the same tokens; the time per prompt is paired)
    smollm2_events: tuple = (5, 9)  # events per SmolLM2 story
    smollm2_split: str = "heldout"  # story templates/names of the SmolLM2 workload (the n-gram store saw only "train")
    smollm2_slow_prompts: int = 4  # early exit on SmolLM2 (ours and HF) runs on the first N prompts only:
    # SmolLM2 is not trained for early exit (alpha < 0.2), each such run is ~3x slower than plain greedy,
    # and 32 prompts x 64 tokens of each would take ~15 min on this shared 2-core machine
    hf_prompt_lookup_tokens: int = 4  # HF prompt_lookup_num_tokens (= our fixed gamma)
    hf_max_matching_ngram: int = 3  # HF max_matching_ngram_size (= our ngram:3)
    models: tuple = ("toy", "smollm2", "general")  # which workloads to run (general: SmolLM2 on stdlib docstrings)
    seed: int = 0  # prompt seed
    toy_fmt: str = "cot"  # toy prompt format (cot prompts make the toy model write a chain)
    events: tuple = (1, 8)  # events per prompt
    tree_drafters: tuple = ("ngram:3", "store:smollm2")  # SmolLM2 drafters also run with token trees (variable widths)
    tree_max_nodes: int = 16  # calibration trees have this many nodes; decoding.tune.choose_tree_nodes picks the size
    tree_depth: int = 8  # deepest branch of a tree
    tree_branch: int = 3  # children per node at most
    calibration_prompts: int = 4  # prompts (another seed, never benchmarked) of the tree-size calibration run
    general_prompts: int = 16  # prompts of the stdlib-docstring workload (decoding.general_prompts, "bench" split)
    general_drafters: tuple = ("ngram:3", "store:smollm2-stdlib", "store:smollm2")  # its drafters: prompt lookup,
    # the store built from the docstrings' disjoint "store" half, and the coin-flip store
    general_gammas: tuple = (7, 11)  # gammas of the general workload's chains (variable windows)
    packed_linears: bool = True  # SmolLM2 runs with its linear weights pre-packed for oneDNN (models.packed) when the
    # CPU build has it, for every method alike; plain greedy with the default kernels is also timed, as a row


QUICK = SpecBenchConfig(n_prompts=2, max_new_tokens=8, gammas=(3, "auto"),
                        toy_drafters=("draft", "early-exit:2", "ngram:3", "bf16"), models=("toy",))
