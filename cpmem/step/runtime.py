"""The process a step runs in, and what is trained: the settings that tell the two measured
runtimes apart, each settable from either door.

``Runtime`` names the process: ``art`` (ART's LoRA trainer on megatron-core, the
calibration harness golden/ measured) or ``megatron-lm`` (Megatron-LM's ``pretrain_gpt.py``,
whose CI recordings golden/megatron/ holds). Each field is one thing that differs between
them, its defaults included; ``Runtime.art()`` and ``Runtime.megatron_lm()`` give each
runtime's values, and any field can be set for either (``--attention-backend``,
``--cp-comm``...). Nothing reads the name to decide a figure: a policy reads the fields
(``tight``'s fitted margin and the measured runtime's extra query-wide tensor are
``fitted_margin`` and ``keeps_query_copy``, ART's, fitted on its cells).

``Training``: ``lora`` trains adapters on a frozen base (the default); ``full`` trains every
parameter (bf16 weights, fp32 main gradients, the optimizer's fp32 master copy and moments,
the distributed optimizer's padded buffers), as Megatron-LM's runs do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal, get_args

from cpmem.errors import InputError

RuntimeName = Literal["art", "megatron-lm"]
RUNTIMES: tuple[RuntimeName, ...] = get_args(RuntimeName)
Training = Literal["lora", "full"]
TRAININGS: tuple[Training, ...] = get_args(Training)
QuantizedWeights = Literal["dequantized", "stored"]
QUANTIZED_WEIGHTS: tuple[QuantizedWeights, ...] = get_args(QuantizedWeights)
"""How a quantized checkpoint's frozen base is held (``StepSettings.quantized_weights``)."""
AttentionBackend = Literal["flash", "fused", "unfused", "local"]
ATTENTION_BACKENDS: tuple[AttentionBackend, ...] = get_args(AttentionBackend)
TransformerImpl = Literal["transformer_engine", "local"]
MoeDispatcher = Literal["alltoall", "allgather", "hybridep"]
DEV_CONTAINER = "dev"
"""The container Transformer Engine's choice is made in where none is named
(``backend_choice.NAMED_CONTAINERS``)."""


@dataclass(frozen=True)
class Runtime:
    """The process a step runs in.

    - ``attention_backend``: the core attention kernel priced (``flash`` and ``fused`` keep
      q, k, v, the output and fp32 softmax statistics; ``unfused`` and ``local`` keep the
      ``s x s`` probabilities); ``backend_asked`` what the user asked for (``auto``: the
      backend Transformer Engine's selection picks, ``cpmem.step.attention_backend``), and
      ``backend_spread`` every backend another container could pick for the same run.
    - ``transformer_impl``: Transformer Engine's modules or megatron's ``local`` ones.
    - ``env``: the process's environment variables that size a buffer
      (``CUBLAS_WORKSPACE_CONFIG``, ``NVTE_*``), as the run states them.
    - ``deterministic``: Megatron-LM's ``--deterministic-mode``.
    - ``dataloader_attention_mask``: the data loader builds a ``[b, 1, s, s]`` bool mask per
      micro-batch (Megatron-LM's default; ``--no-create-attention-mask-in-dataloader``).
    - ``gradient_accumulation_fusion``: weight gradients accumulated into the fp32 main
      gradient inside the GEMM (no bf16 weight gradient is made).
    - ``masked_softmax_fusion``, ``softmax_in_fp32``: the unfused softmax's kernel choice
      (``--no-masked-softmax-fusion``, ``--attention-softmax-in-fp32``).
    - ``softmax_type``: Transformer Engine's softmax (``vanilla``, or ``learnable``: a sink
      logit per head, megatron's ``--softmax-type``), which its backend selection reads
      (FlashAttention off, the fused backend only from cuDNN 9.13.1 and under CP only with
      a2a: ``cpmem.step.attention_backend``). The Hugging Face door's runtime runs
      ``vanilla`` whatever the model's ``attention_sinks``.
    - ``moe_dispatcher``, ``moe_grouped_gemm``, ``overlap_moe_comm``: the MoE token
      dispatcher (``hybridep``: megatron's flex dispatcher with the HybridEP backend,
      ``cpmem.pricing.kinds.moe_dispatch``), grouped expert GEMMs, the combined 1F1B
      schedule's overlap.
    - ``delay_wgrad``: Transformer Engine's GEMMs keep their weight gradients' operands
      until megatron-core's ``backward_dw`` (``--delay-wgrad-compute``, the combined 1F1B
      schedule only; ``cpmem.pricing.delayed_wgrad``).
    - ``moe_router_fusion``: the router's top-k and score function run as Transformer
      Engine's fused kernel (``--moe-router-fusion``; ``cpmem.pricing.kinds.moe``,
      ``FUSED_ROUTER_DROPS_PER_TOPK``).
    - ``moe_row_align``: the grouped experts pad each local expert's rows to a multiple of
      this many into new tensors their GEMMs save (0: not padded; 256 under Transformer
      Engine's op fuser with grouped GEMMs, ``cpmem.megatron.op_fuser_rules``): the rows
      ``Step.grouped_rows_per_token`` prices.
    """

    name: RuntimeName = "art"
    attention_backend: AttentionBackend = "fused"
    backend_asked: str = "fused"
    backend_spread: tuple[AttentionBackend, ...] = ()
    transformer_impl: TransformerImpl = "transformer_engine"
    env: tuple[tuple[str, str], ...] = ()
    deterministic: bool = False
    dataloader_attention_mask: bool = False
    gradient_accumulation_fusion: bool = True
    masked_softmax_fusion: bool = True
    softmax_in_fp32: bool = False
    softmax_type: str = "vanilla"
    moe_dispatcher: MoeDispatcher = "alltoall"
    moe_grouped_gemm: bool = False
    overlap_moe_comm: bool = False
    delay_wgrad: bool = False
    moe_router_fusion: bool = False
    moe_row_align: int = 0
    backend_resolved: bool = True
    """False while ``auto`` waits for the request whose sequence Transformer Engine's
    selection reads: ``StepSettings.step`` resolves it (``backend_choice``)."""
    container: str = DEV_CONTAINER
    """The container the run's software is read from (``backend_choice.NAMED_CONTAINERS``):
    Transformer Engine's choice under ``auto`` is made in it, and its PyTorch compiles
    megatron's fused cross entropy (``cpmem.step.torch_build``); the one named, whatever the
    backend, so a container nothing reads is named as such
    (``registry.inapplicable_options``)."""
    default_policy: str = "reference"
    """The policy a step is priced with where none is named: ART's published LoRA formula
    for its trainer; ``tight`` for Megatron-LM's runs, the one layer-by-layer model its
    recordings check (``cpmem.pricing.registry.default_policy``)."""
    default_recompute: str = "selective"
    """The recompute where neither a mode nor a module is named: ART's ``selective``
    (its harness's core attention), Megatron-LM's ``none``."""
    default_cp_comm: str = "all_gather"
    """The CP comm type where none is named (moved to one Transformer Engine runs the
    model's attention under: ``cpmem.step.cp_comm_rules.default_cp_comm``): ART's ``all_gather``,
    Megatron-LM's ``p2p`` (``--cp-comm-type``)."""
    default_backend: str = "fused"
    """The attention backend where none is named: ART's measured ``fused``; Megatron-LM's
    ``auto``, Transformer Engine's choice (``transformer_config.py:151``)."""
    default_planner: str | None = None
    """The CP planner where none is named: None, the model's own (``plan.planners``);
    Megatron-LM's ``balanced`` split (``get_batch_on_this_cp_rank``)."""
    builds_mtp: bool = False
    """Whether the process builds the model's multi-token-prediction layers
    (``ModelGeometry.mtp_depths``; ``describe_settings`` prices a model without them
    where it does not): Megatron-LM does where its arguments give MTP depths
    (``--mtp-num-layers``, a hybrid pattern's ``/``), and prices a published config's as
    a run of it would build them; ART's trainer does not, as Hugging Face's model
    classes do not (transformers' DeepSeek-V3, Qwen3.5 and NemotronH models leave the
    checkpoint's MTP weights unloaded), and its measured cells' static baselines are
    priced without them."""
    fuses_swiglu: bool | None = None
    """The SwiGLU's fusion where the caller names none: None, the model's; Megatron-LM's
    ``--bias-swiglu-fusion`` default (True)."""
    experts_follow_tp: bool = False
    """The experts' tensor parallelism where none is named: Megatron-LM's ETP = TP
    (``arguments.py:587-588``); 1 for ART's trainer, as its measured MoE cells ran (their
    static baselines match experts split over EP alone)."""
    fitted_margin: bool = True
    """``tight``'s margin was fitted on this runtime's measured cells and prices its steps
    (``cpmem.pricing.tight.calibrated.MARGIN``); it holds the small terms the structure
    leaves unpriced on them (the embedding's token ids, the kernels' softmax statistics),
    which a runtime without it prices as tensors. Megatron-LM's recordings fitted no
    constant of ``tight``: unmargined."""
    keeps_query_copy: bool = True
    """One more query-wide tensor per ungated attention layer than the structure
    (``calibrated.UNGATED_RUNTIME_Q``): measured on ART's cells; Megatron-LM's recordings
    are covered without it."""
    published_formula: bool = True
    """ART's published LoRA formula (``reference``, ``global``) prices this runtime's
    steps; another runtime is priced by ``tight``."""
    answers_peak: bool = False
    """The figure an answer leads with: the device's peak, static memory and activations
    (Megatron-LM's recordings measure the allocator's peak); else the activations (what
    ART's harness measured, admitted beside its static memory)."""
    evidence: str = "art_cells"
    """Whose measurements check this runtime's steps (``cpmem.pricing.provenance``):
    ``art_cells`` (golden/cells.csv) or ``megatron_recordings`` (golden/megatron/)."""
    notes: tuple[str, ...] = field(default=(), compare=False)
    """What the runtime's settings assume (shown with the estimate)."""

    def __post_init__(self) -> None:
        if self.name not in RUNTIMES:
            raise InputError("runtime", self.name, f"must be one of {list(RUNTIMES)}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise InputError(
                "attention_backend",
                self.attention_backend,
                f"must be one of {['auto', *ATTENTION_BACKENDS]}",
            )
        if self.transformer_impl not in get_args(TransformerImpl):
            raise InputError(
                "transformer_impl",
                self.transformer_impl,
                f"must be one of {list(get_args(TransformerImpl))}",
            )
        if self.transformer_impl == "local" and self.attention_backend != "local":
            raise InputError(
                "attention_backend",
                self.attention_backend,
                "the local transformer implementation runs only its own attention (local)",
            )
        if self.moe_dispatcher not in get_args(MoeDispatcher):
            raise InputError(
                "moe_dispatcher",
                self.moe_dispatcher,
                f"must be one of {list(get_args(MoeDispatcher))}",
            )
        object.__setattr__(self, "env", tuple(sorted(dict(self.env).items())))

    @classmethod
    def art(cls) -> Runtime:
        """ART's LoRA trainer as golden/ measured it: Transformer Engine's attention as it
        runs on the H200 (compute capability 9.0), where its selection prefers the fused
        (cuDNN) backend over flash-attn (``cpmem.step.attention_backend``): the measured
        cells keep the attention's tensors as megatron hands them to the kernel, without
        flash-attn's ``bshd`` copies; no data-loader mask; PyTorch's default workspaces."""
        return cls()

    @classmethod
    def megatron_lm(cls, **settings: object) -> Runtime:
        """Megatron-LM's ``pretrain_gpt.py`` with its defaults (the data loader's attention
        mask on, the allgather token dispatcher), the run's own ``settings`` over them."""
        base = cls(
            name="megatron-lm",
            dataloader_attention_mask=True,
            moe_dispatcher="allgather",
            default_policy="tight",
            default_recompute="none",
            default_cp_comm="p2p",
            default_backend="auto",
            default_planner="balanced",
            builds_mtp=True,
            fuses_swiglu=True,
            experts_follow_tp=True,
            fitted_margin=False,
            keeps_query_copy=False,
            published_formula=False,
            answers_peak=True,
            evidence="megatron_recordings",
        )
        return replace(base, **settings)  # type: ignore[arg-type]

    @classmethod
    def named(cls, name: str) -> Runtime:
        """The runtime called ``name`` with its own values."""
        return {"art": cls.art, "megatron-lm": cls.megatron_lm}[check_runtime(name)]()

    def is_runtime(self, name: str) -> bool:
        """Whether ``name`` is this process's runtime: its identity fields
        (``IDENTITY_FIELDS``: the defaults and what the policies read) are that runtime's,
        whatever the run's own settings (its backend, environment, fusions)."""
        own = Runtime.named(name)
        return all(getattr(own, f) == getattr(self, f) for f in IDENTITY_FIELDS)

    def environment(self) -> Mapping[str, str]:
        return dict(self.env)

    def with_backend(
        self, backend: AttentionBackend, asked: str, spread: tuple[AttentionBackend, ...] = ()
    ) -> Runtime:
        return replace(
            self,
            attention_backend=backend,
            backend_asked=asked,
            backend_spread=spread,
            backend_resolved=True,
        )

    def pending_auto(self, container: str = "dev") -> Runtime:
        """``auto`` asked where the sequence is not known yet: resolved when a step is
        planned (its attention backend meanwhile the runtime's own)."""
        return replace(self, backend_asked="auto", backend_resolved=False, container=container)

    @property
    def keeps_attention_scores(self) -> bool:
        """Whether the core attention materialises ``s x s`` probabilities (the unfused
        backends) rather than running one kernel over blocks (flash, fused)."""
        return self.attention_backend in ("unfused", "local")


IDENTITY_FIELDS = (
    "default_policy",
    "default_recompute",
    "default_cp_comm",
    "default_backend",
    "default_planner",
    "fuses_swiglu",
    "experts_follow_tp",
    "fitted_margin",
    "keeps_query_copy",
    "published_formula",
    "answers_peak",
    "evidence",
)
"""The fields that tell one runtime from another (each runtime's own values, never the run's
settings)."""


def check_training(training: str) -> Training:
    if training not in TRAININGS:
        raise InputError("training", training, f"must be one of {list(TRAININGS)}")
    return training


def check_quantized_weights(value: str) -> QuantizedWeights:
    if value not in QUANTIZED_WEIGHTS:
        raise InputError("quantized_weights", value, f"must be one of {list(QUANTIZED_WEIGHTS)}")
    return value


def check_runtime(name: str) -> RuntimeName:
    if name not in RUNTIMES:
        raise InputError("runtime", name, f"must be one of {list(RUNTIMES)}")
    return name
