"""Every option ``estimate`` honours reaches admission: changing only that option moves
``estimate``'s bytes and ``admit``'s required bytes by the same amount. Admission prices
every step as the first and as a steady step of its process and requires the larger, so
its required bytes are the larger of two ``estimate`` calls, ``step="first"`` and
``step="steady"`` (the ``step`` keyword itself is exempt: admission prices both).

One row per keyword of ``describe_step`` / ``describe_settings`` (the ``StepArguments`` /
``SettingsArguments`` TypedDicts), with a guard that the table names every keyword, so a
new option cannot reach ``estimate`` without this test asking whether admission sees it.
Each row says which model and policy make the option matter (the reference prices no
MoE routing, no EP, no compiled widths and no steady step's activations; ``tight`` does).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import pytest

from cpmem.admission.admission import Decision, admit
from cpmem.admission.pricer import Figure
from cpmem.api import estimate
from cpmem.errors import InputError
from cpmem.plan.layout import ParallelLayout
from cpmem.plan.plan import explicit_plan
from cpmem.plan.request import Request
from cpmem.step.describe import SettingsArguments, StepArguments, describe_settings, describe_step
from cpmem.step.profiles import Profile, ProfileStore

HUGE = 1 << 50  # every variant fits: admission answers with the cost-optimal (or explicit) figure
M17, M4, MOE = "qwen3-1.7b", "qwen3.5-4b", "qwen3.5-35b-a3b"

QWEN3_CONFIG: dict[str, Any] = {
    "model_type": "qwen3",
    "num_hidden_layers": 28,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
}
EXPLICIT = {
    "logical_tokens": 8192,
    "packed_tokens": 8192,
    "rank_tokens": [4096, 4096],
    "segments": 2,
}
PROFILE = ProfileStore(
    {describe_step(M4, [2048, 2048], cp=2).signature.key: Profile(10_000_000.0, 4096)}
)


@dataclass(frozen=True)
class Row:
    """``option`` changed from ``before`` to ``after``, everything else in ``common``."""

    option: str
    model: str | None
    common: dict[str, Any]
    before: Any
    after: Any
    policy: str = "reference"
    figure: Figure = "forward"
    lengths: list[int] | None = field(default_factory=lambda: [2048, 2048])
    refused_before: bool = False  # ``before`` is an input both estimate and admit refuse
    planned: bool | None = None  # planned from requests (None: from ``lengths``)

    def arguments(self, value: Any) -> dict[str, Any]:
        args = dict(self.common)
        if value is not None:
            args[self.option] = value
        return args

    def estimated(self, value: Any) -> int:
        """The larger of ``estimate``'s first and steady steps (what admission requires)."""
        return max(self.estimated_kind(value, kind) for kind in ("first", "steady"))

    def estimated_kind(self, value: Any, kind: str) -> int:
        args = self.arguments(value)
        est = estimate(self.model, self.lengths, policy=self.policy, step=kind, **args)
        if self.figure == "forward_backward":
            assert est.forward_backward_bytes is not None
            return est.forward_backward_bytes
        return est.estimate_bytes

    def admitted(self, value: Any, budget: int = HUGE) -> Decision:
        return admit(
            self.model,
            self.lengths,
            budget_bytes=budget,
            policy=self.policy,
            figure=self.figure,
            **self.arguments(value),
        )


ROWS = [
    Row("shared_prefix", M4, {}, 0, 512),
    Row("tp", M17, {}, 1, 2),
    Row("cp", M4, {}, 1, 2),
    # SP changes the layer inputs the full-recompute checkpoints keep (H/s per token)
    Row("sp", M17, {"tp": 2, "recompute": "full"}, True, False),
    # expert parallelism over the TP ranks brings the other TP ranks' sequence shards to
    # a rank's experts: the worst case (a bound, what admission decides on) rises from
    # top-k / TP to top-k rows per token (a capacity of 1, each expert's even share from
    # every source, holds the same rows at any EP)
    Row("ep", MOE, {"tp": 4}, 1, 4, policy="tight", lengths=[4096]),
    Row("recompute", M4, {}, "selective", "full"),
    Row("modules", M4, {"recompute": "selective"}, "core_attn", "core_attn+mlp"),
    Row("planner", M4, {"cp": 2}, "gdn-segments", "balanced", lengths=[3000, 1000]),
    # torch.compile fuses the 1.7B's unfused SwiGLU (tight's widths)
    Row("compiled", M17, {}, False, True, policy="tight"),
    Row(
        "moe_routing", MOE, {"ep": 4}, "concentrated", "capacity:1", policy="tight", lengths=[4096]
    ),
    Row("profiles", M4, {"cp": 2}, None, PROFILE),
    # the returned outputs are the harness's hidden states (a head returns none)
    Row("output_bytes", M4, {"head": "hidden"}, None, 1 << 30),
    # a sequence past max_position_embeddings (40,960 on the 1.7B): refused without it
    Row("allow_long", M17, {}, False, True, lengths=[41_000], refused_before=True),
    Row("fused_swiglu", M17, {}, None, True),
    # what a trainer's step holds beyond the harness (cpmem.step.trainer)
    Row("head", M4, {}, "hidden", "logits"),
    Row("lora_rank", M4, {}, 1, 16, policy="tight"),
    Row("lora_dropout", M4, {}, 0.0, 0.1, policy="tight"),
    Row("lora_targets", M4, {"lora_rank": 64}, "all", "attention", policy="tight"),
    # 1.7B (8 KV heads): p2p keeps no other rank's K/V without a core_attn checkpoint
    Row(
        "cp_comm",
        M17,
        {"cp": 2, "recompute": "none", "head": "hidden"},
        "all_gather",
        "p2p",
        policy="tight",
    ),
    Row("config", None, {}, QWEN3_CONFIG, {**QWEN3_CONFIG, "intermediate_size": 8192}),
    # the counts of a plan the runtime fixed (admitted as it stands: variant "explicit")
    # the logical tokens size the returned hidden states
    Row("logical_tokens", M4, {**EXPLICIT, "cp": 2, "head": "hidden"}, 8192, 9000, lengths=None),
    Row("packed_tokens", M4, {**EXPLICIT, "cp": 2}, 8192, 6000, policy="global", lengths=None),
    Row("rank_tokens", M4, {**EXPLICIT, "cp": 2}, [4096, 4096], [5120, 3072], lengths=None),
    Row(
        "busiest_tokens",
        M4,
        {"logical_tokens": 8192, "packed_tokens": 8192, "segments": 2, "cp": 2},
        4096,
        5000,
        lengths=None,
    ),
    Row("segments", M4, {**EXPLICIT, "cp": 2}, 2, 8, lengths=None),
    Row("gdn_rank_tokens", M4, {**EXPLICIT, "cp": 2}, None, [5000, 3192], lengths=None),
    # pipeline stages: the busiest stage's schedule (cpmem.pricing.pipeline)
    Row("pp", M4, {"microbatches": 4}, 1, 2),
    Row("vpp", M4, {"pp": 2, "microbatches": 4}, 1, 2),
    Row("microbatches", M4, {"pp": 2}, 1, 2),
    Row("stage_layers", M4, {"pp": 2, "microbatches": 2}, [16, 16], [20, 12]),
    Row("first_stage_layers", M4, {"pp": 4, "microbatches": 4}, None, 14),
    Row("last_stage_layers", M4, {"pp": 4, "microbatches": 1}, None, 11),
    # interleaved: groups of 4 micro-batches warm up more forwards than groups of pp = 2
    Row("microbatch_group", M4, {"pp": 2, "vpp": 2, "microbatches": 4}, None, 4),
    # the output layer's weight gradient deferred: the last stage keeps every micro-batch's
    # logits' gradient and the output layer's input until the drain
    Row(
        "deferred_wgrad",
        M17,
        {"pp": 2, "microbatches": 4, "training": "full", "head": "logits"},
        None,
        0,
        policy="tight",
    ),
    # fine-grained offloading: the in-flight chunks' unfused s x s probabilities on the
    # host (cpmem.pricing.offload)
    Row(
        "offload",
        M17,
        {"pp": 2, "microbatches": 4, "attention_backend": "unfused", "recompute": "none"},
        None,
        "core_attn",
        policy="tight",
    ),
    # the process: Megatron-LM's runs carry no fitted margin (tight's calibrated.py)
    Row("runtime", M17, {}, "art", "megatron-lm", policy="tight"),
    # full training: no SP-gathered adapter inputs, the trained output layer's inputs
    Row("training", M17, {"tp": 2}, "lora", "full", policy="tight"),
    # flash-attn's bshd copies: one more query-wide output per attention layer
    Row("attention_backend", M17, {}, "fused", "flash", policy="tight"),
    # under auto the container decides: for head_dim 256 on the H200 the dev image's TE
    # picks the fused (cuDNN 9) backend, NGC 24.01's cuDNN 8.9.7 cannot and no flash-attn
    # is inside TE's gates there: unfused, its s x s probabilities kept
    Row(
        "container",
        M4,
        {"attention_backend": "auto", "recompute": "none"},
        "dev",
        "ngc-24.01",
        policy="tight",
    ),
    # 4-byte activations
    Row("dtype", M17, {}, "bf16", "fp32", policy="tight"),
    Row(
        "microbatch_requests",
        M4,
        {"pp": 2},
        [[2048, 2048], [2048]],
        [[2048, 2048], [8192]],
        lengths=None,
        planned=True,
    ),
]


@dataclass(frozen=True)
class DeviceRow:
    """``option`` moves the static memory or the device: the budget admission derives from
    the step's device (no ``budget_bytes`` given) moves as ``estimate``'s does."""

    option: str
    common: dict[str, Any]
    before: Any
    after: Any
    model: str = M4

    def arguments(self, value: Any, lengths: list[int]) -> dict[str, Any]:
        return {"lengths": lengths, "allow_long": True, **self.common, self.option: value}

    def budget(self, value: Any) -> int:
        est = estimate(self.model, **self.arguments(value, [2048]))
        assert est.device_budget is not None and est.static is not None
        return est.device_budget.budget_bytes

    def admitted(self, value: Any, lengths: list[int]) -> Decision:
        return admit(self.model, **self.arguments(value, lengths))

    def required(self, value: Any, lengths: list[int]) -> int:
        return estimate(self.model, **self.arguments(value, lengths)).estimate_bytes


H200 = {"device": "h200"}
DEVICE_ROWS = [
    # a distributed optimizer shards the master copy and Adam's moments over DP
    DeviceRow("dp", {**H200, "distributed_optimizer": True, "lora_rank": 64}, 1, 8),
    DeviceRow("distributed_optimizer", {**H200, "dp": 8, "lora_rank": 64}, False, True),
    # two instances: each shards the master copy and moments over 4 of the 8 DP ranks
    DeviceRow(
        "optimizer_instances",
        {**H200, "dp": 8, "distributed_optimizer": True, "lora_rank": 64},
        1,
        2,
    ),
    # Megatron FSDP shards full training's weights, gradients and states over DP (the
    # whole-state DDP step beside it) and gathers buckets while the step runs
    DeviceRow(
        "fsdp",
        {**H200, "training": "full", "dp": 8, "policy": "tight"},
        "none",
        "optim_grads_params",
        model=M17,
    ),
    # Muon's layer-wise distributed optimizer: the precomputed layout's padded, bin-packed
    # buffers and shards against the legacy path's whole unpadded buffers and dealt tensors
    DeviceRow(
        "muon_layout",
        {
            **H200,
            "training": "full",
            "optimizer": "muon",
            "distributed_optimizer": True,
            "dp": 8,
            "policy": "tight",
        },
        "legacy",
        "precomputed",
        model=M17,
    ),
    # without an optimizer no gradients or master copies exist
    DeviceRow("optimizer", {**H200, "lora_rank": 64}, "none", "adam"),
    DeviceRow("device", {}, "h100", "h200"),
    DeviceRow("device_total_bytes", {}, 80_000_000_000, 90_000_000_000),
    # the gradient buffer's element: bf16 main gradients and their fp32 copy at the step
    DeviceRow("grad_bytes", {**H200, "lora_rank": 64}, 4, 2),
    # routed experts split over ETP ranks hold a quarter of their weights each; priced
    # with the published formula, whose activations ETP does not move (``tight``'s
    # experts receive the ETP group's gathered rows: the activations move too)
    DeviceRow("etp", {**H200, "tp": 4, "ep": 4, "policy": "reference"}, 1, 4, model=MOE),
    # a quantized checkpoint's base as stored: gpt-oss-20b's mxfp4 experts, 39 GiB in bf16
    DeviceRow("quantized_weights", H200, "dequantized", "stored", model="gpt-oss-20b"),
    # the userbuffer GEMMs' 3-copy cuBLASLt workspace beside the plain one
    DeviceRow("tp_comm_overlap", {**H200, "tp": 2}, False, True),
    # per-layer CUDA graphs keep every graphed layer's static input and causal mask
    DeviceRow("cuda_graphs", H200, None, "transformer_engine:attn,mlp", model=M17),
    # the answered stage: the first holds the embedding, the last the output layer
    DeviceRow("rank", {**H200, "pp": 2, "microbatches": 2, "stage_layers": [8, 24]}, 0, "last"),
]

EXEMPT = {
    # alternative inputs, not options: the same step given another way (a request instead
    # of lengths + shared_prefix, a ready plan instead of its counts);
    # test_alternative_inputs_are_admitted_as_estimated holds them
    "request": "an alternative input (the request behind lengths + shared_prefix)",
    "plan": "an alternative input (a ready plan instead of its counts)",
    # admission prices the first and the steady step whichever is asked;
    # tests/unit/admission/test_budget_step_kinds.py holds that
    "step": "admission prices both step kinds and decides on the larger",
    # FP8 is priced for full training only, whose static memory grows with the tokens
    # (megatron's global buffer), which the device rows' budget at one length assumes not;
    # tests/golden/test_fp8_priced.py holds every byte it moves
    "fp8": "full training only: its static memory moves with the tokens",
    # the double buffer moves static memory (its kept buffers) and the in-flight bound
    # (the units it serves leave it) together; tests/unit/pricing/test_fsdp.py holds both
    "fsdp_buffers": "Megatron FSDP's double buffer: static and in-flight bytes move together",
}


def keywords(typed_dict: Any) -> set[str]:
    return set(typed_dict.__required_keys__ | typed_dict.__optional_keys__)


def test_the_table_names_every_keyword() -> None:
    """Every keyword estimate accepts has a row here or a stated exemption."""
    rows = {r.option for r in ROWS} | {r.option for r in DEVICE_ROWS}
    assert len(rows) == len(ROWS) + len(DEVICE_ROWS), "an option has two rows"
    assert not rows & set(EXEMPT)
    assert rows | set(EXEMPT) == keywords(StepArguments)
    assert keywords(SettingsArguments) <= keywords(StepArguments)


def test_the_typed_dicts_are_the_functions_keywords() -> None:
    """The TypedDicts the guard reads are describe_settings' and describe_step's own
    keywords (a keyword added to a function but not to its TypedDict would escape it):
    describe_settings takes exactly the declaration's (``**Unpack[SettingsArguments]``),
    refusing any other by name."""

    def keyword_only(fn: Any) -> set[str]:
        params = inspect.signature(fn).parameters.values()
        return {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}

    params = inspect.signature(describe_settings).parameters
    assert keyword_only(describe_settings) == set()
    assert "Unpack[SettingsArguments]" in str(params["given"].annotation)
    with pytest.raises(InputError, match="settings"):
        describe_settings("qwen3-1.7b", bogus=1)  # type: ignore[call-arg]
    step_only = keywords(StepArguments) - keywords(SettingsArguments)
    assert keyword_only(describe_step) == step_only


def refused_alike(row: Row) -> None:
    """``before`` is refused by estimate and by admit, with the same error."""
    with pytest.raises(InputError) as by_estimate:
        row.estimated(row.before)
    with pytest.raises(InputError) as by_admit:
        row.admitted(row.before)
    assert str(by_admit.value) == str(by_estimate.value)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.option)
def test_an_option_moves_estimate_and_admission_alike(row: Row) -> None:
    """Changing only ``row.option``: admit's required bytes are estimate's, before and
    after, so both move by the same amount (a refused input: refused by both)."""
    if row.refused_before:
        refused_alike(row)
        after = row.estimated(row.after)
        d = row.admitted(row.after)
        assert (d.action, d.variant, d.required_bytes) == ("fit", "cost-optimal", after)
        return
    before, after = row.estimated(row.before), row.estimated(row.after)
    assert before != after, f"{row.option} does not change the estimate in this row"
    d_before, d_after = row.admitted(row.before), row.admitted(row.after)
    planned = row.lengths is not None if row.planned is None else row.planned
    variant = "cost-optimal" if planned else "explicit"
    for d, figure in ((d_before, before), (d_after, after)):
        assert d.action == "fit" and d.variant == variant
        assert d.required_bytes == figure
    assert d_after.required_bytes - d_before.required_bytes == after - before


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.option)
def test_an_option_changes_the_admission_answer(row: Row) -> None:
    """At a budget of the smaller figure, the setting with it fits as priced and the
    other does not fit as priced (it is split, refused, or laid out otherwise); a
    refused input is priced, and refused one byte below its figure."""
    if row.refused_before:
        refused_alike(row)
        need = row.estimated(row.after)
        assert row.admitted(row.after, need).action == "fit"
        short = row.admitted(row.after, need - 1)
        assert short.action != "fit" and dict(short.considered)["cost-optimal"] == need
        return
    (budget, small), (larger, large) = sorted(
        ((row.estimated(row.before), row.before), (row.estimated(row.after), row.after)),
        key=lambda pair: pair[0],
    )
    fits = row.admitted(small, budget)
    assert fits.action == "fit" and fits.required_bytes == budget
    other = row.admitted(large, budget)
    assert (other.action, other.variant) != ("fit", fits.variant)
    assert dict(other.considered)[fits.variant] == larger


@pytest.mark.parametrize("row", DEVICE_ROWS, ids=lambda r: r.option)
def test_a_device_option_moves_the_budget_alike(row: DeviceRow) -> None:
    """Admission without a budget admits against the budget ``estimate`` reports for the
    step's device, before and after the option changes (and the two differ)."""
    before, after = row.budget(row.before), row.budget(row.after)
    assert before != after, f"{row.option} does not move the device budget in this row"
    for value, budget in ((row.before, before), (row.after, after)):
        d = row.admitted(value, [2048])
        assert d.available_bytes == budget and d.device_budget is not None
        assert d.whole_device()["free_bytes"] == budget - d.required_bytes


@pytest.mark.parametrize("row", DEVICE_ROWS, ids=lambda r: r.option)
def test_a_device_option_changes_the_admission_answer(row: DeviceRow) -> None:
    """A sequence whose activations fit the larger budget but not the smaller one (found
    by bisection on its length): fit under one setting, not under the other."""
    (small, tight_value), (large, roomy_value) = sorted(
        ((row.budget(row.before), row.before), (row.budget(row.after), row.after)),
        key=lambda pair: pair[0],
    )
    lo, hi = 1, 1 << 23  # required(lo) <= large < required(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if row.required(roomy_value, [mid]) <= large else (lo, mid)
    need = row.required(roomy_value, [lo])
    assert small < need <= large, "no length separates the two budgets"
    assert row.admitted(roomy_value, [lo]).action == "fit"
    other = row.admitted(tight_value, [lo])
    assert (other.action, other.variant) != ("fit", "cost-optimal")


def test_a_budget_and_a_device_together_are_refused() -> None:
    with pytest.raises(InputError, match=r"budget_bytes.*not both"):
        admit(M4, [2048], budget_bytes=HUGE, device="h200")
    with pytest.raises(InputError, match=r"budget_bytes.*give a budget \(usable_bytes"):
        admit(M4, [2048])


def test_alternative_inputs_are_admitted_as_estimated() -> None:
    """``request`` and ``plan``: admission prices the step estimate prices for them (at
    the first step, which holds more here: the reference's 64 MiB allowance)."""
    request = Request.shared([3000, 2000, 1500], 500)
    est = estimate(M4, request=request, cp=2, step="first")
    assert est.estimate_bytes > estimate(M4, request=request, cp=2).estimate_bytes
    assert (
        est.estimate_bytes
        == estimate(M4, [3000, 2000, 1500], shared_prefix=500, cp=2, step="first").estimate_bytes
    )
    d = admit(M4, request=request, cp=2, budget_bytes=HUGE)
    assert d.variant == "cost-optimal" and d.required_bytes == est.estimate_bytes
    plan = explicit_plan(
        ParallelLayout(cp=2),
        logical_tokens=8192,
        packed_tokens=8192,
        grad_segments=2,
        rank_tokens=[5120, 3072],
    )
    est = estimate(M4, plan=plan, cp=2, step="first")
    d = admit(M4, plan=plan, cp=2, budget_bytes=HUGE)
    assert d.variant == "explicit" and d.required_bytes == est.estimate_bytes
    counts = estimate(
        M4,
        cp=2,
        logical_tokens=8192,
        packed_tokens=8192,
        segments=2,
        rank_tokens=[5120, 3072],
        step="first",
    )
    assert counts.estimate_bytes == est.estimate_bytes


def test_the_balanced_expectation_is_admitted_on_the_worst_case_and_says_so() -> None:
    """A router without capacity can reach the worst case: admission under ``balanced``
    requires the worst case's figure (``estimate`` under ``concentrated``), names why
    in the decision, and a stated capacity is admitted as stated."""
    common = {"tp": 4, "ep": 4, "policy": "tight"}
    balanced = admit(MOE, [4096], budget_bytes=1 << 50, moe_routing="balanced", **common)
    worst = estimate(MOE, [4096], moe_routing="concentrated", **common)
    expectation = estimate(MOE, [4096], moe_routing="balanced", **common)
    assert expectation.estimate_bytes < worst.estimate_bytes
    assert balanced.required_bytes == max(
        estimate(MOE, [4096], moe_routing="concentrated", step=k, **common).estimate_bytes
        for k in ("first", "steady")
    )
    assert any("worst-case MoE routing" in n for n in balanced.estimate.notes)
    capped = admit(MOE, [4096], budget_bytes=1 << 50, moe_routing="capacity:1", **common)
    assert capped.estimate.facts.moe_routing == "capacity:1"
    assert not any("worst-case" in n for n in capped.estimate.notes)
