"""The first part of the step's settings: the model, the request and how the step runs
it (the command line's ``source``, ``activation``, ``request`` and ``step`` groups), each
with its declaration (``Setting``). ``cpmem.step.settings.SettingsArguments`` extends it
with the process, the whole job, the pipeline and the API's own settings; a TypedDict's
keys keep their order across the extension, so the flags, the API's parameters and the
external description list these first."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypedDict

from cpmem.step.profiles import ProfileStore
from cpmem.step.recompute import MODES, Recompute
from cpmem.step.setting import Setting
from cpmem.step.trainer import CP_COMMS, Head


class RequestSettings(TypedDict, total=False):
    """The model, the request and the step's shape: the first of ``SettingsArguments``'
    keywords."""

    config: Annotated[
        str | Path | dict[str, Any] | None,
        Setting(
            None,
            "--config",
            "path to a Hugging Face config.json (e.g. examples/qwen3-1.7b/config.json)",
            group="source",
            exported_as="config: the model's own config.json, written from its geometry",
        ),
    ]
    fused_swiglu: Annotated[
        bool | None,
        Setting(
            None,
            "--fused-activation",
            "the runtime fuses the SwiGLU activation (default: by model family)",
            group="activation",
            switch=True,
            negation="--unfused-activation",
            negation_help="the runtime runs SwiGLU unfused",
            export=lambda s: s.geometry.fused_swiglu,
        ),
    ]
    tp: Annotated[
        int,
        Setting(
            1,
            "--tp",
            "tensor parallel size (default 1)",
            group="request",
            cli_type=int,
            export=lambda s: s.plan.layout.tp,
        ),
    ]
    cp: Annotated[
        int,
        Setting(
            1,
            "--cp",
            "context parallel size (default 1)",
            group="request",
            cli_type=int,
            export=lambda s: s.plan.layout.cp,
        ),
    ]
    allow_long: Annotated[
        bool,
        Setting(
            False,
            "--allow-long",
            "price sequences longer than the model's max_position_embeddings (warns)",
            group="request",
            switch=True,
            export=lambda s: s.settings.allow_long,
        ),
    ]
    ep: Annotated[
        int,
        Setting(
            1,
            "--ep",
            "expert parallel size, MoE models (default 1): must divide the routed experts "
            "(megatron-core's num_experts % EP == 0)",
            cli_type=int,
            export=lambda s: s.plan.layout.ep,
        ),
    ]
    sp: Annotated[
        bool | None,
        Setting(
            None,
            "--sp",
            "sequence parallel on (the default when --tp > 1)",
            switch=True,
            negation="--no-sp",
            negation_help="sequence parallel off",
            export=lambda s: s.plan.layout.sp,
        ),
    ]
    recompute: Annotated[
        str | Recompute | None,
        Setting(
            None,
            "--recompute",
            "activation recompute: selective (checkpointed modules), none, full (every "
            "layer), no-grad (a forward without backward); default: the runtime's "
            "(selective for --runtime art, none for megatron-lm, Megatron-LM's own default)",
            choices=MODES,
            export=lambda s: str(s.recompute.mode),
        ),
    ]
    modules: Annotated[
        str | Sequence[str] | None,
        Setting(
            None,
            "--modules",
            "modules selective recompute checkpoints, '+'-joined: core_attn, mlp, moe, "
            "shared_experts, layernorm, moe_act, mla_up_proj (megatron-core's names) "
            "(default core_attn)",
            export=lambda s: [str(m) for m in s.recompute.modules],
        ),
    ]
    planner: Annotated[
        str | None,
        Setting(
            None,
            "--planner",
            "who owns which tokens under CP (default: chunked, the measured runtime's "
            "layout, for attention-only models; gdn-segments for hybrid). worst: the most "
            "tokens any planner puts on one rank, when the runtime's layout is unknown",
            export=lambda s: s.plan.planner,
        ),
    ]
    compiled: Annotated[
        bool,
        Setting(
            False,
            "--compiled",
            "the layers run under torch.compile (changes what attention and MLP keep; "
            "priced by --policy tight only, listed as ignored by the others)",
            switch=True,
            export=lambda s: s.compiled,
        ),
    ]
    moe_routing: Annotated[
        str,
        Setting(
            "concentrated",
            "--moe-routing",
            "the rows each rank's experts receive: concentrated (the default, also accepted "
            "as worst: every token's top-k copies on this rank's experts as far as top-k "
            "allows, the bound a router without capacity reaches), balanced (the "
            "expectation; admission still decides on the worst), capacity:F or "
            "capacity:F:pad (Megatron-LM's --moe-expert-capacity-factor F, with "
            "--moe-pad-expert-input-to-capacity: a hard bound) or rows:N (an exact per-rank "
            "row count, a dispatcher's fixed capacity); priced by --policy tight, listed as "
            "ignored by the reference policies",
            metavar="ROUTING",
            export=lambda s: s.moe_routing,
        ),
    ]
    profiles: Annotated[
        ProfileStore | str | Path | None,
        Setting(
            None,
            "--profiles",
            "JSON store of learned-profile floors (largest bytes per token observed for the "
            "step, recorded with `cpmem profile record`; priced by --policy reference and "
            "global, listed as ignored by tight)",
            exported_as="not described: a store of the caller's measurements",
        ),
    ]
    step: Annotated[
        Literal["first", "steady"],
        Setting(
            "steady",
            "--step",
            "which step of the process: steady (default: any step after the first, the "
            "optimizer's moments and the kernel workspaces allocated) or first (a freshly "
            "started process: no moments yet, its kernel set-up paid in the activations; the "
            "measured harness's step); admit --device and capacity decide on the larger of "
            "the two",
            choices=("first", "steady"),
            exported_as="cold: whether the step is the first of its process",
        ),
    ]
    head: Annotated[
        str | Head,
        Setting(
            "logits",
            "--head",
            "what the forward ends with: logits (default: megatron's vocabulary-parallel "
            "output layer and cross entropy, a trainer's step), hidden (the hidden states "
            "returned, the measured harness), fused (megatron's fused vocabulary-parallel "
            "cross entropy: the same fp32 upcast and saved softmax as logits, so a forward "
            "prices as logits does; its backward holds the copy torch.compile makes, by the "
            "container's PyTorch), chunked:N (log-probs N "
            "tokens at a time, each chunk recomputed in backward), linear-ce (a fused linear "
            "cross entropy that never materialises the logits)",
            export=lambda s: s.head.label,
        ),
    ]
    lora_rank: Annotated[
        int,
        Setting(
            1,
            "--lora-rank",
            "LoRA adapter rank (default 1, the measured harness)",
            cli_type=int,
            export=lambda s: s.adapter.rank,
        ),
    ]
    lora_dropout: Annotated[
        float,
        Setting(
            0.0,
            "--lora-dropout",
            "dropout on the adapters' input, in [0, 1) (default 0)",
            cli_type=float,
            export=lambda s: float(s.adapter.dropout),
        ),
    ]
    lora_targets: Annotated[
        str | Sequence[str],
        Setting(
            "all",
            "--lora-targets",
            "projections with adapters: all (default), attention, mlp, or names joined by "
            "commas: qkv, proj, fc1, fc2, gdn_in, gdn_out, experts, mamba_in, mamba_out",
            export=lambda s: list(s.adapter.targets),
        ),
    ]
    cp_comm: Annotated[
        str | None,
        Setting(
            None,
            "--cp-comm",
            "attention's CP communication: all_gather (K/V gathered, the measured runtime; "
            "ART's default), p2p (ring; Megatron-LM's default), a2a (Ulysses all-to-all over "
            "heads), a2a+p2p (Megatron-LM's hierarchical CP, priced as its p2p ring)",
            choices=CP_COMMS,
            export=lambda s: s.cp_comm,
        ),
    ]
