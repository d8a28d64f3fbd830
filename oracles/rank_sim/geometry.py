"""Model geometry as plain numbers: presets, Hugging Face configs, recorded model ids.

The simulator never imports cpmem, so it carries its own description of a model. The
preset numbers restate the geometry table of the measured sources
(golden/sources/README.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any


class SimInputError(ValueError):
    """Bad input, reported as one line naming the field."""

    def __init__(self, field: str, value: object, why: str) -> None:
        super().__init__(f"{field}={value!r}: {why}")
        self.field = field
        self._args = (field, value, why)

    def __reduce__(self) -> tuple[type[SimInputError], tuple[str, object, str]]:
        # a worker process's error reaches the driver whole (pickled with its arguments)
        return (SimInputError, self._args)


@dataclass(frozen=True)
class SimModel:
    """One decoder's shapes. ``kinds`` lists each layer's mixer: ``attention``, ``gdn``,
    ``mamba``, or "" for a layer without one (a hybrid stack's MLP- or MoE-only layer);
    ``mlp_kinds`` each layer's feed-forward ("" for a mixer-only layer)."""

    name: str
    hidden: int
    ffn: int
    q_heads: int
    kv_groups: int
    head_dim: int
    gated_attention: bool
    fused_swiglu: bool
    kinds: tuple[str, ...]
    gdn_key_heads: int = 0
    gdn_key_dim: int = 0
    gdn_value_heads: int = 0
    gdn_value_dim: int = 0
    gdn_conv_kernel: int = 0
    vocab: int = 0
    moe: bool = False  # every layer's FFN is a mixture of experts (Qwen3.5-MoE: all layers)
    num_experts: int = 0
    moe_top_k: int = 0
    expert_ffn: int = 0
    shared_expert_ffn: int = 0  # 0: no shared expert
    # the output layer shares the embedding's weight (HF ``tie_word_embeddings``). Only
    # which parameter the LM head uses changes; no activation does, so geometries that
    # differ only here compare equal.
    tie_embeddings: bool = field(default=False, compare=False)
    # the Hugging Face ``model_type`` the shapes were read from ("" for the presets of the
    # measured families, whose structure the layers' defaults are)
    family: str = ""
    # per layer: its feed-forward kind, "dense" or "moe"; () means every layer's is
    # ``moe``'s ("moe" if ``moe`` else "dense")
    mlp_kinds: tuple[str, ...] = ()
    # per attention layer: its sliding window in tokens, 0 for full causal attention;
    # () means every layer attends fully
    windows: tuple[int, ...] = ()
    # MoE families (qwen3_moe, gpt_oss, deepseek_v3 / kimi_k2: moe.py, from_hf_config)
    dense_ffn: int = 0  # a "dense" layer's FFN width in a model with experts (0: ``ffn``)
    router_score: str = "softmax"  # "softmax" or "sigmoid" (DeepSeek-V3)
    router_pre_softmax: bool = False  # softmax over every expert, then top-k, no renorm
    expert_score_bias: bool = False  # DeepSeek-V3's e_score_correction_bias (routing only)
    router_groups: int = 0  # group-limited top-k: expert groups (HF n_group)
    router_group_topk: int = 0  # groups kept per token (HF topk_group); 0: plain top-k
    routed_scaling: float = 0.0  # routed probs times this (0: not scaled)
    shared_expert_gated: bool = True  # Qwen3.5-MoE's sigmoid gate; DeepSeek's is ungated
    expert_bias: bool = False  # the experts' fc1/fc2 carry biases (gpt-oss)
    expert_activation: str = "swiglu"  # or "clamped_swiglu" (gpt-oss, swiglu_limit)
    swiglu_limit: float = 0.0
    attention_bias: bool = False  # q/k/v and output projections carry biases (gpt-oss)
    qkv_bias: bool = False  # q/k/v carry biases, the output projection none (Qwen2)
    attention_sinks: bool = False  # one learned sink logit per query head (gpt-oss)
    # RMSNorm on q and k per head (Qwen3); Llama, Mistral, Qwen2 and gpt-oss have none
    qk_norm: bool = True
    # attention families (Gemma 2 / 3, multi-head latent attention); the defaults are
    # the measured families' structure, so every existing model is unchanged
    sandwich_norms: bool = False  # Gemma: post-attention and post-feedforward RMSNorm too
    pre_norms: bool = True  # input norms; off: OLMo 2/3, whose sub-layers norm their outputs
    qk_norm_projection: bool = False  # q/k norms over heads x head_dim (OLMo 2/3), not a head
    mlp_activation: str = "silu"  # the GLU's activation: "silu" (SwiGLU), "gelu_tanh" (GeGLU)
    embed_scale: bool = False  # the embedding output multiplied by sqrt(hidden) (Gemma)
    attn_softcap: float = 0.0  # attention logit soft-capping (Gemma 2); 0: none
    final_softcap: float = 0.0  # LM-head logit soft-capping (Gemma 2); 0: none
    # multi-head latent attention (HF deepseek_v3 / kimi_k2): kv_lora_rank > 0 selects it;
    # q_lora_rank 0 is a plain q projection (Moonlight)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # Mamba-2 mixers (megatron-core ``MambaMixer``; hybrid.py): heads, head dim, state
    # dim (d_state), B/C groups, conv kernel and scan chunk (the mixer's defaults 4, 128)
    mamba_heads: int = 0
    mamba_head_dim: int = 0
    mamba_state: int = 0
    mamba_groups: int = 0
    mamba_conv_kernel: int = 4
    mamba_chunk: int = 128
    # the dense MLP is a GLU (fc1 2F wide); False: one F-wide fc1 and ``mlp_activation``
    # "squared_relu" (Megatron's --squared-relu) or "gelu" (its default)
    mlp_gated: bool = True
    # attention layers rotate q and k (rope tables); False: no position embedding in
    # attention (Megatron's learned_absolute / none)
    rope: bool = True
    # layers per pipeline segment when the description fixes them (a hybrid pattern's
    # ``|``); () lets the pipeline split evenly
    pipeline_segments: tuple[int, ...] = field(default=(), compare=False)
    # multi-token prediction (mtp.py): one depth's mixers and feed-forwards (a hybrid
    # pattern's '/' part; () takes megatron GPT's rule, mtp.depth_stack), the depths the
    # description runs (a step may ask for others) and one layer for every depth
    mtp_kinds: tuple[str, ...] = ()
    mtp_mlp_kinds: tuple[str, ...] = ()
    mtp_depths: int = 0
    mtp_shared: bool = False

    @property
    def mla(self) -> bool:
        """The attention layers are multi-head latent attention."""
        return self.kv_lora_rank > 0

    @property
    def rope_width(self) -> int:
        """Width of the rotary tables: the rope part of an MLA head, else the head."""
        return self.qk_rope_head_dim if self.mla else self.head_dim

    @property
    def layers(self) -> int:
        return len(self.kinds)

    @property
    def gdn_layers(self) -> int:
        return sum(k == "gdn" for k in self.kinds)

    @property
    def mamba_layers(self) -> int:
        return sum(k == "mamba" for k in self.kinds)

    def mlp_kind(self, layer: int) -> str:
        """Layer ``layer``'s feed-forward kind: "dense", "moe", or "" (none)."""
        if self.mlp_kinds:
            return self.mlp_kinds[layer]
        return "moe" if self.moe else "dense"

    def window(self, layer: int) -> int:
        """Layer ``layer``'s sliding attention window in tokens (0: full attention)."""
        return self.windows[layer] if self.windows else 0

    def truncated(self, layers: int) -> SimModel:
        """The first ``layers`` layers (the interleave pattern kept)."""
        return replace(self.sliced(0, layers), name=f"{self.name}[:{layers}]")

    def sliced(self, lo: int, hi: int) -> SimModel:
        """Layers [lo, hi): every per-layer field cut alike (a pipeline chunk's)."""
        return replace(
            self,
            kinds=self.kinds[lo:hi],
            mlp_kinds=self.mlp_kinds[lo:hi],
            windows=self.windows[lo:hi],
            pipeline_segments=(),
        )

    def check_tp(self, tp: int) -> None:
        """TP must divide every head count it shards (KV groups may be replicated)."""
        if tp < 1:
            raise SimInputError("tp", tp, "must be >= 1")
        if self.q_heads % tp:
            raise SimInputError("tp", tp, f"does not divide the {self.q_heads} attention heads")
        if tp > 1 and self.qk_norm_projection:
            raise SimInputError(
                "tp", tp, "the q/k norms span the whole projection (OLMo 2): a TP shard "
                "cannot normalise it without gathering it (simulated at TP 1)",
            )  # fmt: skip
        if self.kv_groups % tp and tp % self.kv_groups:
            raise SimInputError("tp", tp, f"and {self.kv_groups} KV groups do not nest")
        if self.gdn_layers and (self.gdn_key_heads % tp or self.gdn_value_heads % tp):
            raise SimInputError("tp", tp, "does not divide the GDN key/value heads")
        if self.ffn % tp:
            raise SimInputError("tp", tp, f"does not divide the FFN width {self.ffn}")
        if self.dense_ffn % tp:
            raise SimInputError("tp", tp, f"does not divide the dense FFN width {self.dense_ffn}")
        if self.mamba_layers and (self.mamba_heads % tp or self.mamba_groups % tp):
            raise SimInputError(
                "tp", tp, f"does not divide the {self.mamba_heads} Mamba heads and "
                f"{self.mamba_groups} groups",
            )  # fmt: skip
        if self.moe and self.shared_expert_ffn % tp:
            raise SimInputError(
                "tp", tp, f"does not divide the shared expert {self.shared_expert_ffn}"
            )

    def check_ep(self, ep: int, world: int) -> None:
        """EP must divide the experts and the TP x CP world it is laid over (ETP = 1)."""
        if ep < 1:
            raise SimInputError("ep", ep, "must be >= 1")
        if not self.moe:
            if ep != 1:
                raise SimInputError("ep", ep, f"{self.name} has no experts")
            return
        if self.num_experts % ep:
            raise SimInputError("ep", ep, f"does not divide the {self.num_experts} experts")
        if world % ep:
            raise SimInputError("ep", ep, f"does not divide the TP x CP world of {world} ranks")


def _hybrid(layers: int) -> tuple[str, ...]:
    """Qwen3.5: full attention at layers 3, 7, 11, ...; the others Gated DeltaNet."""
    return tuple("attention" if i % 4 == 3 else "gdn" for i in range(layers))


# Source: golden-sources README, "Model geometries" table.
PRESETS: dict[str, SimModel] = {
    "qwen3.5-27b": SimModel(
        "qwen3.5-27b",
        5120,
        17408,
        24,
        4,
        256,
        True,
        True,
        _hybrid(64),
        16,
        128,
        48,
        128,
        4,
        248320,
    ),
    "qwen3.5-4b": SimModel(
        "qwen3.5-4b",
        2560,
        9216,
        16,
        4,
        256,
        True,
        True,
        _hybrid(32),
        16,
        128,
        32,
        128,
        4,
        248320,
        tie_embeddings=True,
    ),
    # experts: 256 x 512, top-8, shared expert 512 (sigmoid-gated, Qwen3.5-MoE); ``ffn``
    # is the shared expert's width (the dense field is unused when every layer is MoE)
    "qwen3.5-35b-a3b": SimModel(
        "qwen3.5-35b-a3b",
        2048,
        512,
        16,
        2,
        256,
        True,
        True,
        _hybrid(40),
        16,
        128,
        32,
        128,
        4,
        248320,
        moe=True,
        num_experts=256,
        moe_top_k=8,
        expert_ffn=512,
        shared_expert_ffn=512,
    ),
    "qwen3-1.7b": replace(
        SimModel(
            "qwen3-1.7b", 2048, 6144, 16, 8, 128, False, False, ("attention",) * 28, vocab=151936
        ),
        tie_embeddings=True,
    ),
}

# Recorded ids (golden `model` column) -> preset. Qwen3.8-27B is ART's name for the
# Qwen3.5-27B geometry (golden-sources README).
MODEL_IDS: dict[str, str] = {
    "Qwen/Qwen3.8-27B": "qwen3.5-27b",
    "Qwen/Qwen3.5-27B": "qwen3.5-27b",
    "Qwen/Qwen3.5-4B": "qwen3.5-4b",
    "Qwen/Qwen3-1.7B": "qwen3-1.7b",
    "Qwen/Qwen3.5-35B-A3B": "qwen3.5-35b-a3b",
}


def get_model(name: str) -> SimModel:
    key = MODEL_IDS.get(name, name).lower()
    if key not in PRESETS:
        raise SimInputError("model", name, f"unknown; known: {', '.join(sorted(PRESETS))}")
    return PRESETS[key]


def from_hf_config(raw: dict[str, Any], name: str = "config") -> SimModel:
    """A geometry from a Hugging Face config.json (``text_config`` honoured)."""
    text = raw.get("text_config", raw)

    def get(key: str, default: Any = None) -> Any:
        value = text.get(key, raw.get(key, default))
        if value is None:
            raise SimInputError(f"config.{key}", None, "missing")
        return value

    family = str(text.get("model_type") or raw.get("model_type") or "")
    if family and family not in FAMILIES:
        raise SimInputError(
            "config.model_type", family, f"not simulated; supported: {', '.join(FAMILIES)}"
        )
    hidden, layers = int(get("hidden_size")), int(get("num_hidden_layers"))
    heads = int(get("num_attention_heads"))
    kinds: tuple[str, ...]
    if text.get("layer_types"):
        kinds = tuple(
            "gdn" if t == "linear_attention" else "attention" for t in text["layer_types"]
        )
    elif text.get("full_attention_interval"):
        step = int(text["full_attention_interval"])
        kinds = tuple("attention" if (i + 1) % step == 0 else "gdn" for i in range(layers))
    else:
        kinds = ("attention",) * layers
    hybrid = "gdn" in kinds
    moe: dict[str, Any] = {}
    dense_mla = family in MLA_FAMILIES and not text.get("n_routed_experts")
    if family in MOE_FAMILIES and not dense_mla:  # an MLA config without experts is dense
        moe = moe_family_fields(text, family, layers, get)
    elif family != "nemotron_h" and (text.get("num_experts") or text.get("n_routed_experts")):
        experts = int(text.get("num_experts") or text.get("n_routed_experts"))
        moe = {
            "moe": True,
            "num_experts": experts,
            "moe_top_k": int(get("num_experts_per_tok")),
            "expert_ffn": int(get("moe_intermediate_size")),
            "shared_expert_ffn": int(text.get("shared_expert_intermediate_size") or 0),
        }
        if moe["moe_top_k"] > experts:
            raise SimInputError("config.num_experts_per_tok", moe["moe_top_k"], "exceeds experts")
    fields: dict[str, Any] = dict(
        name=str(raw.get("_name_or_path") or name),
        hidden=hidden,
        ffn=moe["shared_expert_ffn"] if moe else int(get("intermediate_size")),
        q_heads=heads,
        kv_groups=int(text.get("num_key_value_heads", heads)),
        head_dim=int(text.get("head_dim") or hidden // heads),
        gated_attention=bool(text.get("attn_output_gate", hybrid)),
        # Qwen3.5-family runtimes run the fused SwiGLU; Qwen3 the unfused one (sources).
        fused_swiglu=hybrid or family.startswith("qwen3_5"),
        kinds=kinds,
        gdn_key_heads=int(text.get("linear_num_key_heads", 0)) if hybrid else 0,
        gdn_key_dim=int(text.get("linear_key_head_dim", 0)) if hybrid else 0,
        gdn_value_heads=int(text.get("linear_num_value_heads", 0)) if hybrid else 0,
        gdn_value_dim=int(text.get("linear_value_head_dim", 0)) if hybrid else 0,
        gdn_conv_kernel=int(text.get("linear_conv_kernel_dim", 4)) if hybrid else 0,
        vocab=int(text.get("vocab_size", 0)),
        tie_embeddings=bool(text.get("tie_word_embeddings", raw.get("tie_word_embeddings", False))),
        # the measured families' structure is the layers' defaults: recorded as ""
        family="" if family in DEFAULT_FAMILIES else family,
        **moe,
    )
    fields.update(_attention_family(text, family, layers, get))
    fields.update(_plain_attention(text, family))
    if family == "nemotron_h":  # Mamba-2 hybrid stacks (hybrid.py)
        from oracles.rank_sim.hybrid import nemotron_h_fields

        fields.update(nemotron_h_fields(text, layers, get))
    return SimModel(**fields)


# The dense families whose attention has no q/k RMSNorm, as transformers builds them
# (huggingface/transformers, src/transformers/models/<family>/modeling_<family>.py):
# ``LlamaAttention``, ``MistralAttention`` and ``Qwen2Attention`` define q_proj, k_proj,
# v_proj and o_proj and no q_norm / k_norm (``Qwen3Attention`` adds
# ``q_norm``/``k_norm = Qwen3RMSNorm(head_dim)``). Their biases: ``LlamaAttention``
# ``bias=config.attention_bias`` on all four projections (``LlamaConfig`` default false);
# ``MistralAttention`` ``bias=False`` on all four; ``Qwen2Attention`` ``bias=True`` on
# q/k/v and ``bias=False`` on o_proj, whatever the config says.
PLAIN_ATTENTION_FAMILIES = ("llama", "mistral", "qwen2")


def _plain_attention(text: dict[str, Any], family: str) -> dict[str, Any]:
    """The q/k norm and biases of a Llama, Mistral or Qwen2 config; {} for others."""
    if family == "llama":
        return {"qk_norm": False, "attention_bias": bool(text.get("attention_bias", False))}
    if family == "mistral":
        return {"qk_norm": False}
    if family == "qwen2":
        return {"qk_norm": False, "qkv_bias": True}
    return {}


GEMMA_FAMILIES = ("gemma2", "gemma3_text", "gemma3")
# OLMo 2 / 3: ``Olmo2DecoderLayer``'s post-norms and no input norms, ``Olmo2Attention``'s
# q/k norms over the whole projections, ``Olmo3Attention``'s windows (README.md)
OLMO_FAMILIES = ("olmo2", "olmo3")
MLA_FAMILIES = ("deepseek_v3", "kimi_k2")


def _attention_family(text: dict[str, Any], family: str, layers: int, get: Any) -> dict[str, Any]:
    """The attention families' fields of a config (Gemma 2 / 3: transformers'
    ``Gemma2Config`` / ``Gemma3TextConfig``; MLA: ``DeepseekV3Config``); {} for others."""
    if family in GEMMA_FAMILIES:
        types = text.get("layer_types")
        if not types:  # the configs' own defaults: Gemma 2 alternates, Gemma 3 5:1
            pattern = text.get("sliding_window_pattern")
            pattern = int(pattern if pattern is not None else 2 if family == "gemma2" else 6)
            if pattern < 1:
                raise SimInputError("config.sliding_window_pattern", pattern, "must be >= 1")
            types = [
                "sliding_attention" if (i + 1) % pattern else "full_attention"
                for i in range(layers)
            ]
        if len(types) != layers:
            raise SimInputError("config.layer_types", len(types), f"needs one per layer ({layers})")
        unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
        if unknown:
            raise SimInputError("config.layer_types", unknown[0], "not a Gemma layer type")
        window = 0
        if "sliding_attention" in types:
            window = int(get("sliding_window"))
            if window < 1:
                raise SimInputError("config.sliding_window", window, "must be >= 1")
        act = str(text.get("hidden_activation") or text.get("hidden_act") or "gelu_pytorch_tanh")
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise SimInputError("config.hidden_activation", act, "only gelu_pytorch_tanh")
        return {
            "family": family,
            "kinds": ("attention",) * layers,
            "windows": tuple(window if t == "sliding_attention" else 0 for t in types),
            "qk_norm": family != "gemma2",
            "sandwich_norms": True,
            # Gemma2Config / Gemma3TextConfig tie the embeddings by default
            "tie_embeddings": bool(text.get("tie_word_embeddings", True)),
            "mlp_activation": "gelu_tanh",
            "embed_scale": True,
            "attn_softcap": float(text.get("attn_logit_softcapping") or 0.0),
            "final_softcap": float(text.get("final_logit_softcapping") or 0.0),
        }
    if family in OLMO_FAMILIES:
        windows: tuple[int, ...] = ()
        if family == "olmo3":  # Olmo3Config: 3 sliding layers of 4, sliding_window 4096
            types = text.get("layer_types") or [
                "sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(layers)
            ]
            if len(types) != layers:
                raise SimInputError("config.layer_types", len(types), f"one per layer ({layers})")
            window = int(text.get("sliding_window") or 4096)
            windows = tuple(window if t == "sliding_attention" else 0 for t in types)
        return {
            "family": family,
            "kinds": ("attention",) * layers,
            "windows": windows,
            "pre_norms": False,
            "sandwich_norms": True,
            "qk_norm": True,
            "qk_norm_projection": True,
        }
    if family in MLA_FAMILIES:
        dims = {
            key: int(get(key))
            for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        }
        for key, value in dims.items():
            if value < 1:
                raise SimInputError(f"config.{key}", value, "must be >= 1")
        if dims["qk_rope_head_dim"] % 2:
            raise SimInputError("config.qk_rope_head_dim", dims["qk_rope_head_dim"], "must be even")
        q_rank = int(text.get("q_lora_rank") or 0)  # null: a plain q projection (Moonlight)
        if q_rank < 0:
            raise SimInputError("config.q_lora_rank", q_rank, "must be >= 1 or null")
        heads = int(get("num_attention_heads"))
        return {
            "family": family,
            "kv_groups": heads,  # every head has its own k_nope and v
            "head_dim": dims["qk_nope_head_dim"] + dims["qk_rope_head_dim"],
            "gated_attention": False,
            "qk_norm": False,
            "q_lora_rank": q_rank,
            **dims,
        }
    return {}


# MoE families: the Hugging Face model_types whose expert layers moe.py restates
MOE_FAMILIES = ("qwen3_moe", "gpt_oss", "deepseek_v3", "kimi_k2")
# the model_types whose structure the layers' defaults are (SimModel.family "")
DEFAULT_FAMILIES = (
    "qwen3", "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text",
)  # fmt: skip
# every model_type from_hf_config reads (a config without one is read as the generic
# decoder these fields describe)
FAMILIES = (
    *DEFAULT_FAMILIES, *PLAIN_ATTENTION_FAMILIES, *MOE_FAMILIES, "gemma2", "gemma3_text", "gemma3",
    "nemotron_h", *OLMO_FAMILIES,
)  # fmt: skip


def moe_family_fields(
    text: dict[str, Any], family: str, layers: int, get: Callable[..., Any]
) -> dict[str, Any]:
    """The SimModel fields of a qwen3_moe, gpt_oss or deepseek_v3/kimi_k2 config: which
    layers are MoE, the router, the experts and (gpt-oss) the attention's extras. Field
    names and defaults are Hugging Face's (``Qwen3MoeConfig``, ``GptOssConfig``,
    ``DeepseekV3Config``); a missing or inconsistent field is named."""

    def positive(key: str, default: Any = None) -> int:
        value = int(get(key, default))
        if value < 1:
            raise SimInputError(f"config.{key}", value, "must be >= 1")
        return value

    out: dict[str, Any] = {"moe": True}
    if family == "gpt_oss":
        experts = positive("num_local_experts")
        out["expert_ffn"] = positive("intermediate_size")
    else:
        experts = positive("num_experts" if family == "qwen3_moe" else "n_routed_experts")
        out["expert_ffn"] = positive("moe_intermediate_size")
    top_k = positive("num_experts_per_tok")
    if top_k > experts:
        raise SimInputError("config.num_experts_per_tok", top_k, f"exceeds {experts} experts")
    out.update(num_experts=experts, moe_top_k=top_k, shared_expert_ffn=0)
    kinds = ["moe"] * layers
    if family == "qwen3_moe":
        # Qwen3MoeDecoderLayer: MoE unless listed in mlp_only_layers, every
        # decoder_sparse_step-th layer
        step = positive("decoder_sparse_step", 1)
        only = text.get("mlp_only_layers") or []
        if any(not 0 <= int(i) < layers for i in only):
            raise SimInputError("config.mlp_only_layers", only, f"outside 0..{layers - 1}")
        kinds = ["dense" if i in only or (i + 1) % step else "moe" for i in range(layers)]
        out["router_pre_softmax"] = not bool(text.get("norm_topk_prob", False))
    elif family == "gpt_oss":
        out.update(
            expert_bias=True,
            expert_activation="clamped_swiglu",
            swiglu_limit=float(get("swiglu_limit", 7.0)),
            attention_bias=bool(text.get("attention_bias", True)),
            attention_sinks=True,
            qk_norm=False,
        )
        types = text.get("layer_types") or [
            "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)
        ]  # GptOssConfig's default pattern
        if len(types) != layers or any(
            t not in ("sliding_attention", "full_attention") for t in types
        ):
            raise SimInputError("config.layer_types", types, "sliding/full_attention per layer")
        if "sliding_attention" in types:
            window = positive("sliding_window")
            out["windows"] = tuple(window if t == "sliding_attention" else 0 for t in types)
    else:  # deepseek_v3, kimi_k2 (DeepseekV3MoE, DeepseekV3TopkRouter)
        dense = int(get("first_k_dense_replace", 0))
        if not 0 <= dense <= layers:
            raise SimInputError("config.first_k_dense_replace", dense, f"outside 0..{layers}")
        kinds = ["dense"] * dense + ["moe"] * (layers - dense)
        shared = int(text.get("n_shared_experts") or 0)
        score = str(get("scoring_func", "sigmoid"))
        if score not in ("sigmoid", "softmax"):
            raise SimInputError("config.scoring_func", score, "sigmoid or softmax")
        groups, keep = int(get("n_group", 1)), int(get("topk_group", 1))
        if experts % groups:
            raise SimInputError("config.n_group", groups, f"does not divide {experts} experts")
        if not 1 <= keep <= groups or top_k % keep:
            raise SimInputError("config.topk_group", keep, f"1..{groups}, dividing top-k {top_k}")
        out.update(
            shared_expert_ffn=shared * out["expert_ffn"],
            shared_expert_gated=False,
            router_score=score,
            expert_score_bias=score == "sigmoid",
            router_groups=groups,
            router_group_topk=keep,
            routed_scaling=float(get("routed_scaling_factor", 1.0)),
        )
    out["mlp_kinds"] = tuple(kinds)
    if "dense" in kinds:
        out["dense_ffn"] = positive("intermediate_size")
    return out


def load_config(path: str | Path) -> SimModel:
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SimInputError("config", str(path), f"cannot read: {exc}") from None
    return from_hf_config(raw, Path(path).stem)
