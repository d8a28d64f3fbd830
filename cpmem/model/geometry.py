"""Model geometry: the shapes that decide how many bytes a token leaves behind per layer."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Literal

from cpmem.errors import InputError, require_nonnegative_int, require_positive_int
from cpmem.model.quantization import Quantization

MixerKind = Literal["attention", "gdn", "mamba", "none"]
MlpKind = Literal["dense", "moe", "none"]
MIXER_KINDS: tuple[MixerKind, ...] = ("attention", "gdn", "mamba", "none")
MLP_KINDS: tuple[MlpKind, ...] = ("dense", "moe", "none")
RouterScoring = Literal["topk_softmax", "softmax_topk", "sigmoid"]
NormKind = Literal["rmsnorm", "layernorm"]
PositionKind = Literal["rope", "learned", "none"]
NORM_KINDS: tuple[NormKind, ...] = ("rmsnorm", "layernorm")
POSITION_KINDS: tuple[PositionKind, ...] = ("rope", "learned", "none")


@dataclass(frozen=True)
class ModelGeometry:
    """Shapes of a decoder: a stack of layers, then the LM head and any multi-token
    prediction (MTP) layers.

    ``mixers[i]`` is layer i's token mixer (attention in its variants, Gated DeltaNet,
    Mamba-2, or ``none``) and ``mlps[i]`` its feed-forward kind (a dense MLP, a mixture of
    experts, or ``none``): a transformer layer has both; Megatron-LM's hybrid stacks
    (``--hybrid-layer-pattern``, HF ``hybrid_override_pattern``) are layers of one
    sub-layer each (``M``: Mamba-2 alone, ``*``: attention alone, ``-``: an MLP alone,
    ``E``: an MoE alone), each with its own input norm. The attention's variant (gated,
    latent, windows, sinks) and each kind's shapes are the model's. ``mtp_mixers`` /
    ``mtp_mlps``: the layers of one MTP depth (empty: no MTP), repeated ``mtp_depths``
    times after the last layer, sharing one set of weights where ``mtp_shared``.
    """

    name: str
    hidden: int
    mixers: tuple[MixerKind, ...]
    mlps: tuple[MlpKind, ...]
    q_heads: int
    kv_groups: int
    head_dim: int
    vocab: int
    ffn: int = 0
    attention_output_gate: bool = False
    gdn_key_heads: int = 0
    gdn_key_dim: int = 0
    gdn_value_heads: int = 0
    gdn_value_dim: int = 0
    gdn_conv_kernel: int = 0
    # Mamba-2 (megatron-core's ``MambaMixer``, HF ``NemotronHMamba2Mixer``): heads of
    # ``mamba_head_dim`` (the inner width ``mamba_heads x mamba_head_dim``), the SSM state
    # size per head, the groups B and C are shared over, the causal conv's kernel and the
    # chunked scan's chunk
    mamba_heads: int = 0
    mamba_head_dim: int = 0
    mamba_state_dim: int = 0
    mamba_groups: int = 0
    mamba_conv_kernel: int = 0
    mamba_chunk: int = 0
    num_experts: int = 0
    moe_top_k: int = 0
    expert_ffn: int = 0
    shared_expert_ffn: int = 0
    fused_swiglu: bool = True
    activation_clamp: float | None = None
    tied_embeddings: bool = False
    # per layer: its sliding attention window in tokens, 0 for full causal attention
    # (Gemma, gpt-oss, Mistral); () means every layer attends fully. No byte term reads
    # it: Transformer Engine's CP attention keeps every rank's K/V under all_gather and a2a
    # whatever the window (docs/model-families.md, "Sliding windows under CP"), so a
    # windowed layer is priced as a full one. What reads it: ``StepSettings`` refuses
    # cp_comm='p2p' under CP for a windowed model, as Transformer Engine does;
    # ``StepSettings.with_backend_for`` hands the window to Transformer Engine's backend
    # selection when every layer slides (the largest one; a model with full layers is
    # selected as unwindowed); and it is exported to external estimators.
    windows: tuple[int, ...] = ()
    # post-sub-layer norms: a post-attention and a post-feed-forward RMSNorm on each
    # sub-layer's output before the residual add, each saving its H-wide input: Gemma's
    # sandwich (beside the pre-norms) and OLMo 2's (instead of them: ``pre_norms`` False)
    sandwich_norms: bool = False
    # each sub-layer normalises its input (every family but OLMo 2 / OLMo 3, whose
    # attention and MLP read the residual stream itself and normalise their outputs)
    pre_norms: bool = True
    # q/k RMSNorm before rope, as the family's attention class builds it (Qwen3, Qwen3-MoE,
    # Qwen3-Next, Qwen3.5, Gemma 3; not Llama, Mistral, Qwen2, Gemma 2, gpt-oss; latent
    # attention normalises its compressed query and KV instead: ``cpmem.model.hf_families``):
    # its two head_dim-wide weights, and in ``tight`` the saved query copy and the freed
    # CP-gathered projection that depend on it (``cpmem.pricing.kinds.attention``)
    qk_norm: bool = True
    # the q and k norms span the whole projection (OLMo 2 / OLMo 3: ``RMSNorm(heads x
    # head_dim)`` and ``RMSNorm(kv_heads x head_dim)``) rather than one head: their
    # weights are Q and KV wide, and each normalises the flattened projection, a copy
    # where the rank's groups interleave (``cpmem.pricing.kinds.attention``); TP > 1
    # cannot shard them (``check_tp``)
    qk_norm_projection: bool = False
    # the LM head's final logit soft-capping ``cap * tanh(logits / cap)`` (Gemma 2)
    final_logit_softcap: float | None = None
    # frozen biases: only their parameters (a frozen linear's bias saves nothing).
    # ``attention_bias``: the q/k/v projection's biases and the output projection's
    # (``cpmem.pricing.weights``); Qwen2's and GLM-4.5's attention have the first and not
    # the second, and are priced with both (H parameters a layer more than they hold)
    attention_bias: bool = False
    mlp_bias: bool = False
    router_bias: bool = False
    # the layer kinds Megatron-LM's arguments vary (every Hugging Face family cpmem reads
    # is RMSNorm, a gated MLP, rope and no dropout): the norm (LayerNorm holds a bias
    # beside its weight), whether the MLP is gated (SwiGLU, GeGLU: fc1 is 2F wide) or
    # plain (GeLU, squared ReLU: fc1 is F wide), the position embedding (``learned``: a
    # ``learned_position_rows x H`` table on the first stage, megatron's
    # ``learned_absolute`` with ``max_position_embeddings`` rows), and the dropout
    # probabilities of the hidden states (after attention, after the MLP, after the
    # embedding) and of the attention probabilities
    norm: NormKind = "rmsnorm"
    gated_mlp: bool = True
    positions: PositionKind = "rope"
    learned_position_rows: int = 0
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    # the vocabulary is padded to a multiple of this x TP (megatron's
    # ``--make-vocab-size-divisible-by``, 128 by default)
    vocab_multiple: int = 128
    # gpt-oss's learned per-head attention sink logits (one fp32-sized scalar per head)
    attention_sinks: bool = False
    # how the router scores the experts: top-k of the logits then a softmax over them
    # (Qwen3.5-MoE, gpt-oss), a softmax over every expert then top-k (Qwen3-MoE), or a
    # sigmoid per expert (DeepSeek-V3); the latter two keep an E-wide fp32 score per token
    router_scoring: RouterScoring = "topk_softmax"
    # the router's z-loss (megatron-core's ``--moe-z-loss-coeff``): the bytes of one router
    # logit where it is on, 0 where it is off. ``logsumexp`` keeps the ``[tokens, E]``
    # logits and its ``[tokens]`` result, which ``square`` keeps too (moe_utils.py
    # ``z_loss_func``), in the router's dtype; no Hugging Face family trains with it
    router_z_loss_bytes: int = 0
    # whether the shared expert's output is scaled by a sigmoid gate (Qwen3.5-MoE,
    # Qwen3-Next) or added as is (DeepSeek-V3's shared experts)
    shared_expert_gate: bool = True
    # multi-head latent attention (DeepSeek-V3, Kimi-K2, Moonlight): the query's low-rank
    # projection (0: a plain query projection), the compressed KV rank, and the per-head
    # rope / no-rope query-key dims and value dim. ``head_dim`` is then nope + rope and
    # ``kv_groups`` the query heads.
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # multi-token prediction (DeepSeek-V3's ``num_nextn_predict_layers``, Megatron-LM's
    # ``--mtp-num-layers``): one depth's layers, the depths, whether every depth runs the
    # same layers' weights (``--mtp-use-repeated-layer``)
    mtp_mixers: tuple[MixerKind, ...] = ()
    mtp_mlps: tuple[MlpKind, ...] = ()
    mtp_depths: int = 0
    mtp_shared: bool = False
    # the Hugging Face ``model_type`` the shapes were read from ("" for a preset of the
    # measured families); a label: the fields above carry every shape it implies
    family: str = field(default="", compare=False)
    aliases: tuple[str, ...] = field(default=(), compare=False)
    # the longest sequence the model's positions cover (config ``max_position_embeddings``);
    # None: not recorded. Not a shape: it prices nothing, so geometries compare without it.
    max_position_embeddings: int | None = field(default=None, compare=False)
    # parts of the checkpoint left out of every figure, each "field: what and why" (a
    # multimodal wrapper's vision tower, ``cpmem.model.vision``); every estimate lists them
    # (``cpmem.pricing.registry.inapplicable_options``). Not a shape: geometries compare
    # without it.
    unpriced_parts: tuple[str, ...] = field(default=(), compare=False)
    # a model chunk of a pipeline stage (``cpmem.pricing.pipeline.chunk_step``), which may
    # hold no layer: a first virtual stage of the embedding alone, or a last one of the
    # final norm, the output layer and the loss (``cpmem.step.pipeline.Pipeline``)
    pipeline_chunk: bool = False
    # how the checkpoint stores its quantized linears (its ``quantization_config``,
    # ``cpmem.model.quantization``); None: every weight in the checkpoint's float dtype.
    # The step decides whether the frozen base is held as stored or dequantized
    # (``StepSettings.quantized_weights``)
    quantization: Quantization | None = None

    def __post_init__(self) -> None:
        for name in ("hidden", "q_heads", "kv_groups", "head_dim", "vocab"):
            require_positive_int(name, getattr(self, name))
        for name in (
            "ffn",
            "gdn_key_heads",
            "gdn_key_dim",
            "gdn_value_heads",
            "gdn_value_dim",
            "gdn_conv_kernel",
            "num_experts",
            "moe_top_k",
            "expert_ffn",
            "shared_expert_ffn",
            "q_lora_rank",
            "kv_lora_rank",
            "qk_rope_head_dim",
            "qk_nope_head_dim",
            "v_head_dim",
            "mamba_heads",
            "mamba_head_dim",
            "mamba_state_dim",
            "mamba_groups",
            "mamba_conv_kernel",
            "mamba_chunk",
            "mtp_depths",
            "router_z_loss_bytes",
        ):
            require_nonnegative_int(name, getattr(self, name))
        if self.windows and len(self.windows) != len(self.mixers):
            raise InputError(
                "windows", len(self.windows), f"must name one window per layer ({len(self.mixers)})"
            )
        for i, w in enumerate(self.windows):
            require_nonnegative_int(f"windows[{i}]", w)
        if self.kv_lora_rank:
            for name in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
                require_positive_int(name, getattr(self, name))
            if self.head_dim != self.qk_rope_head_dim + self.qk_nope_head_dim:
                raise InputError(
                    "head_dim", self.head_dim, "must be qk_nope_head_dim + qk_rope_head_dim (MLA)"
                )
            if self.kv_groups != self.q_heads:
                raise InputError("kv_groups", self.kv_groups, "must equal q_heads under MLA")
        if self.router_scoring not in ("topk_softmax", "softmax_topk", "sigmoid"):
            raise InputError(
                "router_scoring",
                self.router_scoring,
                "must be topk_softmax, softmax_topk or sigmoid",
            )
        if self.norm not in NORM_KINDS:
            raise InputError("norm", self.norm, f"must be one of {list(NORM_KINDS)}")
        if self.positions not in POSITION_KINDS:
            raise InputError("positions", self.positions, f"must be one of {list(POSITION_KINDS)}")
        for name in ("hidden_dropout", "attention_dropout"):
            p = getattr(self, name)
            if isinstance(p, bool) or not isinstance(p, int | float) or not 0 <= p < 1:
                raise InputError(name, p, "must be a probability in [0, 1)")
        require_positive_int("vocab_multiple", self.vocab_multiple)
        require_nonnegative_int("learned_position_rows", self.learned_position_rows)
        if (self.positions == "learned") != (self.learned_position_rows > 0):
            raise InputError(
                "learned_position_rows",
                self.learned_position_rows,
                "a learned position table has rows exactly where positions are learned",
            )
        if self.final_logit_softcap is not None and not self.final_logit_softcap > 0:
            raise InputError("final_logit_softcap", self.final_logit_softcap, "must be > 0")
        if not self.mixers and not self.pipeline_chunk:
            raise InputError("mixers", self.mixers, "a model needs at least one layer")
        if len(self.mlps) != len(self.mixers):
            raise InputError(
                "mlps", len(self.mlps), f"must name one MLP kind per layer ({len(self.mixers)})"
            )
        self._check_stack("mixers", "mlps", self.mixers, self.mlps)
        if len(self.mtp_mlps) != len(self.mtp_mixers):
            raise InputError(
                "mtp_mlps",
                len(self.mtp_mlps),
                f"must name one MLP kind per MTP layer ({len(self.mtp_mixers)})",
            )
        if self.mtp_mixers:
            self._check_stack("mtp_mixers", "mtp_mlps", self.mtp_mixers, self.mtp_mlps)
        if bool(self.mtp_mixers) != (self.mtp_depths > 0):
            raise InputError(
                "mtp_depths", self.mtp_depths, "MTP has depths exactly where it has layers"
            )
        if self.q_heads % self.kv_groups:
            raise InputError("kv_groups", self.kv_groups, f"must divide q_heads ({self.q_heads})")
        self._check_norms()
        if "gdn" in self.all_mixers:
            for name in ("gdn_key_heads", "gdn_key_dim", "gdn_value_heads", "gdn_value_dim"):
                require_positive_int(name, getattr(self, name))
            require_positive_int("gdn_conv_kernel", self.gdn_conv_kernel)
        if "mamba" in self.all_mixers:
            for name in (
                "mamba_heads",
                "mamba_head_dim",
                "mamba_state_dim",
                "mamba_groups",
                "mamba_conv_kernel",
                "mamba_chunk",
            ):
                require_positive_int(name, getattr(self, name))
            if self.mamba_heads % self.mamba_groups:
                raise InputError(
                    "mamba_groups",
                    self.mamba_groups,
                    f"must divide mamba_heads ({self.mamba_heads}) (megatron-core MambaMixer)",
                )
        if "dense" in self.all_mlps:
            require_positive_int("ffn", self.ffn)
        if "moe" in self.all_mlps:
            require_positive_int("num_experts", self.num_experts)
            require_positive_int("moe_top_k", self.moe_top_k)
            require_positive_int("expert_ffn", self.expert_ffn)
            if self.moe_top_k > self.num_experts:
                raise InputError(
                    "moe_top_k", self.moe_top_k, f"exceeds num_experts ({self.num_experts})"
                )
        if self.max_position_embeddings is not None:
            require_positive_int("max_position_embeddings", self.max_position_embeddings)
        if self.activation_clamp is not None and not self.activation_clamp > 0:
            raise InputError("activation_clamp", self.activation_clamp, "must be > 0 or None")

    def _check_norms(self) -> None:
        """Post-norm-only layers are priced for attention, dense and MoE sub-layers (the
        other kinds' specs price the input norm they build); a projection-wide q/k norm
        needs a q/k norm and plain attention."""
        if not self.pre_norms:
            if not self.sandwich_norms:
                raise InputError(
                    "pre_norms",
                    False,
                    "a layer without pre-norms needs its post-norms (sandwich_norms)",
                )
            other = sorted(self.all_mixers - {"attention", "none"})
            if other or self.is_mla:
                raise InputError(
                    "pre_norms",
                    False,
                    "post-norm-only layers are priced for attention, dense and MoE "
                    f"sub-layers, not {other or ['latent attention']}",
                )
        if self.qk_norm_projection and (not self.qk_norm or self.is_mla):
            raise InputError(
                "qk_norm_projection", True, "needs a q/k norm (qk_norm) on plain attention"
            )

    def _check_stack(
        self, mixer_field: str, mlp_field: str, mixers: tuple[str, ...], mlps: tuple[str, ...]
    ) -> None:
        """Every layer names known kinds and has a mixer or a feed-forward block."""
        problems = []
        for i, (kind, mkind) in enumerate(zip(mixers, mlps, strict=True)):
            if kind not in MIXER_KINDS:
                problems.append(f"{mixer_field}[{i}]={kind!r}: must be one of {list(MIXER_KINDS)}")
            if mkind not in MLP_KINDS:
                problems.append(f"{mlp_field}[{i}]={mkind!r}: must be one of {list(MLP_KINDS)}")
            if kind == "none" and mkind == "none":
                problems.append(
                    f"{mixer_field}[{i}]: a layer needs a mixer or a feed-forward block"
                )
        if problems:
            raise InputError(mixer_field, len(mixers), "; ".join(problems))

    @property
    def layers(self) -> int:
        return len(self.mixers)

    @cached_property
    def all_mixers(self) -> frozenset[str]:
        """Every mixer kind the model runs, its MTP layers' included."""
        return frozenset(self.mixers) | frozenset(self.mtp_mixers)

    @cached_property
    def all_mlps(self) -> frozenset[str]:
        """Every feed-forward kind the model runs, its MTP layers' included."""
        return frozenset(self.mlps) | frozenset(self.mtp_mlps)

    @property
    def mamba_inner(self) -> int:
        """Mamba-2's inner width: ``mamba_heads x mamba_head_dim``."""
        return self.mamba_heads * self.mamba_head_dim

    @cached_property
    def layer_kinds(self) -> tuple[tuple[str, str, int], ...]:
        """The distinct (mixer, MLP) layer kinds with how many layers are of each, in the
        order they first appear: what a sum or max over layers reads (computed once per
        geometry; a pricing call would otherwise walk every layer)."""
        counts: dict[tuple[str, str], int] = {}
        for pair in zip(self.mixers, self.mlps, strict=True):
            counts[pair] = counts.get(pair, 0) + 1
        return tuple((mixer, mlp, n) for (mixer, mlp), n in counts.items())

    @cached_property
    def mixer_kinds(self) -> tuple[str, ...]:
        """The distinct mixer kinds of the stack, in the order it first shows them."""
        return tuple(dict.fromkeys(self.mixers))

    @cached_property
    def mlp_kinds(self) -> tuple[str, ...]:
        """The distinct feed-forward kinds of the stack, in the order it first shows them."""
        return tuple(dict.fromkeys(self.mlps))

    def mixer_count(self, kind: str) -> int:
        """How many layers have a mixer of ``kind``."""
        return self._mixer_counts.get(kind, 0)

    def mlp_count(self, kind: str) -> int:
        """How many layers have a feed-forward block of ``kind``."""
        return self._mlp_counts.get(kind, 0)

    @cached_property
    def _mixer_counts(self) -> dict[str, int]:
        return {k: self.mixers.count(k) for k in self.mixer_kinds}

    @cached_property
    def _mlp_counts(self) -> dict[str, int]:
        return {k: self.mlps.count(k) for k in self.mlp_kinds}

    @property
    def gdn_layers(self) -> int:
        return self.mixer_count("gdn")

    @property
    def attention_layers(self) -> int:
        return self.mixer_count("attention")

    @property
    def moe_layers(self) -> int:
        return self.mlp_count("moe")

    @property
    def is_hybrid(self) -> bool:
        return self.gdn_layers > 0

    @property
    def is_moe(self) -> bool:
        return self.moe_layers > 0

    @property
    def q_width(self) -> int:
        """Q = q_heads x head_dim."""
        return self.q_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """KV = kv_groups x head_dim."""
        return self.kv_groups * self.head_dim

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (a compressed KV rank is set)."""
        return self.kv_lora_rank > 0

    @property
    def value_head_dim(self) -> int:
        """Per-head width of V and of the attention output: MLA's ``v_head_dim``, else
        ``head_dim``."""
        return self.v_head_dim if self.is_mla else self.head_dim

    @property
    def kv_pair_width(self) -> int:
        """K and V together per token: ``kv_groups x (head_dim + value_head_dim)``."""
        return self.kv_groups * (self.head_dim + self.value_head_dim)

    @property
    def attention_output_width(self) -> int:
        """The attention output per token (the output projection's input):
        ``q_heads x value_head_dim``."""
        return self.q_heads * self.value_head_dim

    @property
    def windowed(self) -> bool:
        """Whether any layer attends over a sliding window."""
        return any(self.windows)

    def window(self, layer: int) -> int:
        """Layer ``layer``'s sliding window in tokens (0: full attention)."""
        return self.windows[layer] if self.windows else 0

    @property
    def gdn_key_width(self) -> int:
        """K = gdn_key_heads x gdn_key_dim."""
        return self.gdn_key_heads * self.gdn_key_dim

    @property
    def gdn_value_width(self) -> int:
        """V = gdn_value_heads x gdn_value_dim."""
        return self.gdn_value_heads * self.gdn_value_dim

    @property
    def mtp_layers(self) -> int:
        """The MTP layers a model holds weights for: one depth's layers, once where every
        depth shares them (``mtp_shared``), else once per depth."""
        return len(self.mtp_mixers) * (1 if self.mtp_shared else self.mtp_depths)

    def without_mtp(self) -> ModelGeometry:
        """The same model without its MTP layers (a runtime that does not build them)."""
        if not self.mtp_depths:
            return self
        return replace(self, mtp_mixers=(), mtp_mlps=(), mtp_depths=0, mtp_shared=False)

    def with_fused_swiglu(self, fused: bool) -> ModelGeometry:
        """The same model under a runtime that does (or does not) fuse the SwiGLU activation."""
        return replace(self, fused_swiglu=fused)

    def check_lengths(self, lengths: list[int], allow_long: bool = False) -> list[str]:
        """Sequences longer than ``max_position_embeddings`` raise InputError naming the
        first; with ``allow_long`` they are priced anyway and a warning is returned."""
        limit = self.max_position_embeddings
        if limit is None:
            return []
        warnings = []
        for i, n in enumerate(lengths):
            if n > limit:
                reason = f"exceeds max_position_embeddings ({limit:,}) of {self.name}"
                if not allow_long:
                    raise InputError(
                        f"lengths[{i}]", n, f"{reason}; pass --allow-long to price it anyway"
                    )
                warnings.append(f"lengths[{i}]={n}: {reason}; priced anyway (--allow-long)")
        return warnings

    def check_tp(self, tp: int) -> None:
        """Raise InputError if tensor parallelism ``tp`` cannot shard this model's heads."""
        require_positive_int("tp", tp)
        if "attention" in self.all_mixers:
            if self.q_heads % tp:
                raise InputError("tp", tp, f"must divide q_heads ({self.q_heads}) of {self.name}")
            if self.kv_groups >= tp and self.kv_groups % tp:
                raise InputError(
                    "tp", tp, f"must divide kv_groups ({self.kv_groups}) of {self.name}"
                )
            if self.kv_groups < tp and tp % self.kv_groups:
                raise InputError(
                    "tp", tp, f"must be a multiple of kv_groups ({self.kv_groups}) of {self.name}"
                )
        if tp > 1 and self.qk_norm_projection:
            raise InputError(
                "tp",
                tp,
                f"{self.name}'s q/k norms span the whole projection (OLMo 2's "
                "RMSNorm(heads x head_dim)): a TP-sharded projection cannot normalise it "
                "without gathering it whole (transformers' TP plan for the family gathers q, "
                "k and v; Megatron-Bridge's OLMoE builds the norm at the full width, which a "
                "TP shard does not fit); price it at TP 1",
            )
        sharded_heads = {
            "gdn": ("gdn_key_heads", "gdn_value_heads"),
            "mamba": ("mamba_heads", "mamba_groups"),  # megatron-core MambaMixer's asserts
        }
        for kind, names in sharded_heads.items():
            for name in names if kind in self.all_mixers else ():
                count = getattr(self, name)
                if count % tp:
                    raise InputError("tp", tp, f"must divide {name} ({count}) of {self.name}")


def hybrid_layout(layers: int, full_attention_interval: int) -> tuple[MixerKind, ...]:
    """Mixers of a hybrid stack: full attention at every ``interval``-th layer (3, 7, ...)."""
    require_positive_int("full_attention_interval", full_attention_interval)
    return tuple(
        "attention" if (i + 1) % full_attention_interval == 0 else "gdn" for i in range(layers)
    )


def sliding_layout(layers: int, window: int, full_attention_interval: int) -> tuple[int, ...]:
    """Per-layer windows of a stack whose every ``interval``-th layer attends fully and
    the others over ``window`` tokens (gpt-oss and Gemma 2: every 2nd; Gemma 3: every
    6th)."""
    require_positive_int("window", window)
    require_positive_int("full_attention_interval", full_attention_interval)
    return tuple(0 if (i + 1) % full_attention_interval == 0 else window for i in range(layers))
