"""Every option crossed with every policy, dense and MoE models, heads, step kinds and
learned profiles: an option is priced or named, never both.

For each change away from the step's default: where the estimate names the option
(``ignored_options``), no figure moves (activations, forward+backward, static memory);
where it does not, a figure moves, or the option is one whose ``--help`` says why it
cannot matter there (``fused`` prices as ``logits``), or the same change moves the step
that returns hidden states (the head held the peak: the option is priced, the head's
transient hid it), or, for an option of the attention layers on an MoE model, the same
change moves the dense model's step under the same policy (an MoE layer held the peak),
or the container's Transformer Engine picks the same backend under ``auto``. The options
include the layout's and the process's (EP and ETP on a dense model, SP at TP 1, the
rank answered, DP and the distributed optimizer, micro-batches at PP 1, the container,
``allow_long``) on ART's LoRA steps and on Megatron-LM's full training.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest

from cpmem.api import describe_step, estimate
from cpmem.cli_help import HELP
from cpmem.errors import InputError
from cpmem.pricing.estimate import Estimate
from cpmem.step.profiles import ProfileStore

LENGTHS = [6144, 2048]  # uneven: CP planners lay it out differently
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "dense": ("qwen3-1.7b", {"tp": 2, "cp": 2}),
    "dense-tp1": ("qwen3-1.7b", {"cp": 2}),
    "full": ("qwen3-1.7b", {"tp": 2, "runtime": "megatron-lm", "training": "full"}),
    "hybrid-moe": ("qwen3.5-35b-a3b", {"tp": 4, "ep": 4, "cp": 2}),
    "moe": ("qwen3-30b-a3b", {"tp": 2, "ep": 4, "cp": 2}),
    "moe-ep1": ("qwen3-30b-a3b", {"tp": 2, "cp": 2}),
}
OPTIONS: dict[str, dict[str, Any]] = {
    "compiled": {"compiled": True},
    "moe_routing": {"moe_routing": "balanced"},
    "attention_backend": {"attention_backend": "flash"},
    "attention_backend=unfused": {"attention_backend": "unfused"},
    "fused_swiglu": {"fused_swiglu": True},
    "fused_swiglu=False": {"fused_swiglu": False},
    "recompute": {"recompute": "none"},
    "recompute=full": {"recompute": "full"},
    "modules": {"modules": "core_attn+mlp"},
    "modules=moe": {"modules": "core_attn+moe"},
    "cp_comm": {"cp_comm": "p2p"},
    "cp_comm=a2a": {"cp_comm": "a2a"},
    "head": {"head": "fused"},
    "head=chunked": {"head": "chunked:1024"},
    "lora_rank": {"lora_rank": 16},
    "lora_dropout": {"lora_dropout": 0.1},
    "dtype": {"dtype": "fp32"},
    "planner": {"planner": "balanced"},
    "sp": {"sp": True},  # at TP 1 (sp=False at TP 2 under LoRA moves nothing by structure:
    # the norm's 2H/2 and the LoRA wrapper's gathered H are the unsharded 2H)
    "ep": {"ep": 2},
    "etp": {"etp": 2},
    "rank": {"rank": "last"},
    "rank=0": {"rank": 0},
    "dp": {"dp": 2},
    "distributed_optimizer": {"distributed_optimizer": True},
    "optimizer": {"optimizer": "sgd"},
    "microbatches": {"microbatches": 2},
    "container": {"container": "ngc-24.01"},
    "allow_long": {"allow_long": True},
}
NAMED_PART: dict[str, dict[str, Any]] = {"modules=moe": {"modules": "core_attn"}}
"""Changes of which one part is named (a dense model has no ``moe`` to checkpoint): where
it is named, the figures are compared with the change less that part (Megatron-LM's
runtime recomputes nothing by default, so naming a module also turns selective on)."""
ATTENTION_OPTIONS = ("cp_comm", "attention_backend")
"""Options priced on attention layers only: on an MoE model an MoE layer may hold the peak."""
SAID_IN_HELP = {"head": ("--head", "prices as logits does")}
"""Options whose ``--help`` says why a change prices as the default does."""
POLICIES = ("reference", "global", "tight")


def _figures(est: Estimate) -> tuple[Any, ...]:
    return est.estimate_bytes, est.forward_backward_bytes, est.static.total if est.static else 0


def _named(est: Estimate, option: str) -> bool:
    key = option.partition("=")[0]
    return any(o.partition(":")[0] == key for o in est.ignored_options)


def _changed(model: str, common: dict[str, Any], change: dict[str, Any]) -> bool:
    """Whether the change moves the step away from its default (the asking itself of a
    fusion is not a change: compare the steps without it)."""
    a = describe_step(model, LENGTHS, **common)
    b = describe_step(model, LENGTHS, **{**common, **change})
    quiet = {"fused_swiglu_asked": False}
    return replace(a.settings, **quiet) != replace(b.settings, **quiet) or a.plan != b.plan


def _moves(model: str, policy: str, common: dict[str, Any], change: dict[str, Any]) -> bool:
    base = estimate(model, LENGTHS, policy=policy, **common)
    return _figures(base) != _figures(
        estimate(model, LENGTHS, policy=policy, **{**common, **change})
    )


CONTEXTS = [
    c
    for c in itertools.product(MODELS, POLICIES, ("steady", "first"), ("logits", "hidden"))
    if c[0] != "full" or c[1] == "tight"  # the reference policies refuse full training
]


@pytest.mark.parametrize(("kind", "policy", "step", "head"), CONTEXTS)
def test_every_option_is_priced_or_named(kind: str, policy: str, step: str, head: str) -> None:
    model, layout = MODELS[kind]
    common = {**layout, "step": step, "head": head}
    base = estimate(model, LENGTHS, policy=policy, **common)
    checked = 0
    for option, change in OPTIONS.items():
        if option.startswith("head") and head != "logits":
            continue
        try:
            if not _changed(model, common, change):
                continue
            est = estimate(model, LENGTHS, policy=policy, **{**common, **change})
        except InputError:
            continue  # refused, with the reason: neither priced nor silently ignored
        checked += 1
        moved = _figures(est) != _figures(base)
        if _named(est, option):
            if option in NAMED_PART:
                part = {**common, **NAMED_PART[option]}
                moved = _figures(est) != _figures(estimate(model, LENGTHS, policy=policy, **part))
            assert not moved, f"{option} is named as ignored yet moves the figure"
        elif not moved:
            key = option.partition("=")[0]
            if key in SAID_IN_HELP:
                flag, said = SAID_IN_HELP[key]
                assert said in HELP[flag]
            elif key == "container":  # read by Transformer Engine's choice under auto,
                # which picks the same backend in both containers here
                assert est.backend_asked == "auto"
                assert est.attention_backend == base.attention_backend
            else:
                hidden = {**common, "head": "hidden"}
                dense_model, dense_layout = MODELS["dense"]
                dense = {**dense_layout, "step": step, "head": "hidden"}
                assert (head == "logits" and _moves(model, policy, hidden, change)) or (
                    kind != "dense"
                    and key in ATTENTION_OPTIONS
                    and _moves(dense_model, policy, dense, change)
                ), f"{option} moves nothing under {policy} and is not named"
    assert checked >= 10


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("option", ["compiled", "fused_swiglu", "recompute", "cp_comm"])
def test_an_ignored_option_cannot_change_which_profile_applies(policy: str, option: str) -> None:
    """A learned floor observed for the step keeps flooring it where the option is
    named as ignored: Qwen3-1.7B at TP2 CP2, 8,192 tokens, under ``reference``
    with ``--compiled`` once fell from 35.9 GB to 13.4 GB (the profile's key held
    ``compiled``)."""
    model, common = "qwen3-1.7b", {"tp": 2, "cp": 2}
    plain = describe_step(model, [4096, 4096], **common)
    store = ProfileStore()
    store.observe(plain.signature, peak_bytes=30 * 10**9, tokens=plain.plan.busiest_tokens)
    floored = {**common, "profiles": store}
    change = OPTIONS[option]
    base = estimate(model, [4096, 4096], policy=policy, **floored)
    est = estimate(model, [4096, 4096], policy=policy, **floored, **change)
    if _named(est, option):
        assert _figures(est) == _figures(base)
    if policy != "tight":  # tight prices no learned floors
        assert base.components.get("profile_floor", 0) > 0
        if _named(est, option):
            assert est.components["profile_floor"] == base.components["profile_floor"]
