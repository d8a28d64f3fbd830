"""What each family's published architecture fixes, read from transformers' modeling and
configuration classes, and the published defaults a multimodal wrapper's ``text_config`` is
completed with.

A config states a model's sizes; whether its attention normalises q and k, which
projections carry biases, and what an absent field means are the family's: the modeling
class builds them whatever the config says. ``FAMILIES`` holds them per ``model_type`` with
the classes they were read from (huggingface/transformers, ``src/transformers/models/``;
``tests/unit/model/test_family_architecture.py`` holds each family to them):

- q/k norm: ``Qwen3Attention``, ``Qwen3MoeAttention``, ``Qwen3NextAttention``,
  ``Qwen3_5Attention`` (``q_norm``/``k_norm``, ``RMSNorm(head_dim)``) and
  ``Gemma3Attention`` have one; ``LlamaAttention``, ``MistralAttention``,
  ``Qwen2Attention``, ``Qwen2MoeAttention``, ``GemmaAttention``, ``Gemma2Attention``,
  ``Starcoder2Attention``, ``Ernie4_5Attention`` and ``GptOssAttention`` have none; latent attention
  (``DeepseekV3Attention``, ``DeepseekV2Attention``) normalises its compressed query and
  KV instead (``q_a_layernorm``, ``kv_a_layernorm``: ``cpmem.pricing.weights``' MLA
  parameters; a null ``q_lora_rank`` is a plain ``q_proj`` without ``q_a_layernorm``).
- biases: ``bias=config.attention_bias`` on q, k, v and o for Llama, Qwen3, Qwen3-MoE, the
  hybrids, Gemma 2/3 and gpt-oss (``GptOssConfig`` defaults it to true); ``Qwen2Attention``
  has q/k/v biases always and none on o, ``Qwen2MoeAttention`` q/k/v by ``qkv_bias``
  (true) and none on o; ``MistralAttention`` none ever; ``Starcoder2Attention`` q/k/v/o
  and ``Starcoder2MLP`` by ``use_bias`` (true), ``Ernie4_5Attention``'s q/k/v/o and
  ``Ernie4_5MLP`` by ``use_bias`` (false). ``LlamaMLP`` reads ``mlp_bias``; gpt-oss's
  experts and router always carry biases (``GptOssExperts``' ``gate_up_proj_bias``/
  ``down_proj_bias``, ``GptOssTopKRouter.bias``); no other MLP has one.
- norms: every family normalises each sub-layer's input; Gemma 2/3 also its output
  (``post_attention_layernorm``, ``post_feedforward_layernorm``), OLMo 2/3 its output
  only (``Olmo2DecoderLayer``: no input norm), with q/k norms over the whole projection
  (``Olmo2Attention``: ``q_norm = RMSNorm(heads x head_dim)``, ``k_norm =
  RMSNorm(kv_heads x head_dim)``), as are OLMoE's under its input norms
  (``OlmoeAttention``); GLM-4.5's per-head q/k norms follow ``use_qk_norm``
  (``Glm4MoeAttention``); StarCoder 2's norms are LayerNorms, its MLP a plain GeLU.
- the hybrids' attention always gates its output (``Qwen3_5Attention``: a q projection of
  ``2 x heads x head_dim``, ``attn_output * sigmoid(gate)``): ``attn_output_gate`` is not a
  field of ``Qwen3_5TextConfig``.
- defaults where a field is absent: the configuration classes' (``head_dim``,
  ``tie_word_embeddings``, the activation, ``sliding_window``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

SOURCE_COMMITS = {
    "modeling_llama.py": "5dd4a63548857797727ae73eeb6a6e886ea02a3e",
    "modeling_mistral.py": "005a187ea7c5a291ef79f737d47233641ac17f24",
    "configuration_mistral.py": "001f85b38fb432858ace93f18622f07cec46d874",
    "modeling_qwen2.py": "00d4b3d2142cb4ced2f51b90614b5d26bc045015",
    "configuration_qwen2.py": "008e574391258935f3ecc3035c882e73bbcac419",
    "configuration_qwen3.py": "008e574391258935f3ecc3035c882e73bbcac419",
    "configuration_qwen3_moe.py": "008e574391258935f3ecc3035c882e73bbcac419",
    "modeling_qwen3_5.py": "009e78d6e89fd6f3e68cf81ba95ccc682c8cdda9",
    "configuration_qwen3_5.py": "008e574391258935f3ecc3035c882e73bbcac419",
    "configuration_qwen3_5_moe.py": "008e574391258935f3ecc3035c882e73bbcac419",
    "modeling_gemma2.py": "006e86931247d7bacf94ad00ada1fb6baf11e94b",
    "modeling_gemma3.py": "0018aa647bb13801f061e2d1027c326f531b59fb",
    "configuration_gemma3.py": "008f5c8c29be84d4721dc6d1e0fcd72300580be4",
    "modeling_gpt_oss.py": "00d4b3d2142cb4ced2f51b90614b5d26bc045015",
    "configuration_nemotron_h.py": "13923c63d59f73faebae79b2ee3fafc7e3a35201",
    "modular_nemotron_h.py": "008d9e9577b0eb0149aa6bb0c44da582b10e0b6e",
    "modular_phi3.py": "2b6c089d5a0b18d59a08c36b91404ece60915cf3",
    "configuration_phi3.py": "008e574391258935f3ecc3035c882e73bbcac419",
    "modeling_glm4_moe.py": "a0699c971daff96403489086fcfd07469d20b17f",
    "configuration_glm4_moe.py": "c7ec229ad64cdcf0176f669969c66c9a652e7f38",
    "modeling_olmo2.py": "000c33fdfde12e1ffafbfcdb3c926df5727a00b6",
    "configuration_olmo2.py": "008e574391258935f3ecc3035c882e73bbcac419",
    "modular_olmo3.py": "cdac24dfb91d98fdf0ad46100831380418c3760d",
    "modular_mixtral.py": "7792ab1a984cb369352b985f63393090ab0819c3",
    "configuration_mixtral.py": "008e574391258935f3ecc3035c882e73bbcac419",
    "configuration_smollm3.py": "008e574391258935f3ecc3035c882e73bbcac419",
    "modular_qwen2_moe.py": "001f85b38fb432858ace93f18622f07cec46d874",
    "configuration_qwen2_moe.py": "008e574391258935f3ecc3035c882e73bbcac419",
    "modular_olmoe.py": "052b1dcdbe751ed16e8da95261021318f170a130",
    "configuration_olmoe.py": "008e574391258935f3ecc3035c882e73bbcac419",
    "modular_gemma.py": "008e574391258935f3ecc3035c882e73bbcac419",
    "configuration_gemma.py": "008e574391258935f3ecc3035c882e73bbcac419",
    "modeling_starcoder2.py": "00d4b3d2142cb4ced2f51b90614b5d26bc045015",
    "configuration_starcoder2.py": "008e574391258935f3ecc3035c882e73bbcac419",
    "modular_deepseek_v2.py": "000c33fdfde12e1ffafbfcdb3c926df5727a00b6",
    "modular_ernie4_5.py": "7abb76c59ed6042dde3b0046841dfa69643e96cd",
    "configuration_ernie4_5.py": "2b6c089d5a0b18d59a08c36b91404ece60915cf3",
    "modular_ernie4_5_moe.py": "a4d4492db0a8bea16dce21574473fd3809d40bc3",
}
"""The huggingface/transformers commits the facts below were read at."""


@dataclass(frozen=True)
class Family:
    """One ``model_type``'s layer as its modeling class builds it.

    ``attention_bias`` / ``mlp_bias``: None where a config field decides (``bias_field`` /
    ``mlp_bias_field``, its default ``*_bias_default``), else the value the class fixes. ``head_dim``: the
    config class's default (None: ``hidden_size // num_attention_heads``). ``window``: the
    default ``sliding_window`` (None: the family has no sliding window, unless
    ``slides``: it reads a ``sliding_window`` whose default is null). ``qk_norm_field``:
    the config field that switches the q/k norms (``qk_norm`` its default). ``norm``: the
    layer's norm (LayerNorm holds a bias beside its weight); ``gated_mlp``: whether the MLP
    multiplies an activated gate by an up projection (``False``: one ``c_fc`` and its
    activation, StarCoder 2)."""

    source: str
    qk_norm: bool
    attention_bias: bool | None = None
    attention_bias_default: bool = False
    mlp_bias: bool | None = False
    tied: bool = False
    head_dim: int | None = None
    activation: str = "silu"
    gated_attention: bool = False
    sandwich_norms: bool = False
    router_bias: bool = False
    attention_sinks: bool = False
    shared_expert_gate: bool = True
    window: int | None = None
    slides: bool = False
    qk_norm_field: str = ""
    pre_norms: bool = True
    qk_norm_projection: bool = False
    bias_field: str = "attention_bias"
    mlp_bias_field: str = "mlp_bias"
    mlp_bias_default: bool = False
    norm: str = "rmsnorm"
    gated_mlp: bool = True


def _hybrid(source: str) -> Family:
    return Family(source, qk_norm=True, head_dim=256, gated_attention=True)


FAMILIES: Mapping[str, Family] = MappingProxyType(
    {
        "llama": Family(
            "modeling_llama.py LlamaAttention, LlamaMLP (bias=config.mlp_bias)",
            qk_norm=False,
            mlp_bias=None,
        ),
        "mistral": Family(
            "modeling_mistral.py MistralAttention (bias=False), MistralMLP; "
            "configuration_mistral.py MistralConfig (sliding_window=4096)",
            qk_norm=False,
            attention_bias=False,
            window=4096,
        ),
        "qwen2": Family(
            "modeling_qwen2.py Qwen2Attention (q/k/v bias=True, o bias=False); "
            "configuration_qwen2.py Qwen2Config",
            qk_norm=False,
            attention_bias=True,
            window=4096,
        ),
        "qwen3": Family(
            "modeling_qwen3.py Qwen3Attention (q_norm, k_norm); configuration_qwen3.py "
            "Qwen3Config (head_dim=128)",
            qk_norm=True,
            head_dim=128,
            window=4096,
        ),
        "qwen3_moe": Family(
            "modeling_qwen3_moe.py Qwen3MoeAttention (q_norm, k_norm); "
            "configuration_qwen3_moe.py Qwen3MoeConfig",
            qk_norm=True,
            window=4096,
        ),
        "qwen3_next": _hybrid("modeling_qwen3_next.py Qwen3NextAttention (q_norm, k_norm)"),
        "qwen3_5": _hybrid("modeling_qwen3_5.py Qwen3_5Attention (q_norm, k_norm, gate)"),
        "qwen3_5_text": _hybrid("modeling_qwen3_5.py Qwen3_5Attention (q_norm, k_norm, gate)"),
        "qwen3_5_moe": _hybrid("modeling_qwen3_5_moe.py Qwen3_5MoeAttention"),
        "qwen3_5_moe_text": _hybrid("modeling_qwen3_5_moe.py Qwen3_5MoeAttention"),
        "gemma2": Family(
            "modeling_gemma2.py Gemma2Attention (no q/k norm), Gemma2DecoderLayer",
            qk_norm=False,
            tied=True,
            head_dim=256,
            activation="gelu_pytorch_tanh",
            sandwich_norms=True,
            window=4096,
        ),
        "gemma3_text": Family(
            "modeling_gemma3.py Gemma3Attention (q_norm, k_norm), Gemma3DecoderLayer; "
            "configuration_gemma3.py Gemma3TextConfig",
            qk_norm=True,
            tied=True,
            head_dim=256,
            activation="gelu_pytorch_tanh",
            sandwich_norms=True,
            window=4096,
        ),
        "gpt_oss": Family(
            "modeling_gpt_oss.py GptOssAttention (sinks), GptOssExperts, GptOssTopKRouter",
            qk_norm=False,
            attention_bias_default=True,
            mlp_bias=True,
            head_dim=64,
            router_bias=True,
            attention_sinks=True,
            window=128,
        ),
        "deepseek_v3": Family(
            "modeling_deepseek_v3.py DeepseekV3Attention (q_a_layernorm, kv_a_layernorm)",
            qk_norm=False,
            shared_expert_gate=False,
        ),
        "kimi_k2": Family(
            "Kimi-K2's modeling_deepseek.py (remote code: DeepseekV3Attention)",
            qk_norm=False,
            shared_expert_gate=False,
        ),
        "phi3": Family(
            "modular_phi3.py Phi3Attention (one qkv_proj, bias=False, no q/k norm), Phi3MLP "
            "(one gate_up_proj, bias=False: the shapes of gate and up), "
            "Phi3DecoderLayer (pre-norms; resid_pdrop dropouts); configuration_phi3.py "
            "Phi3Config (sliding_window=None, tie_word_embeddings=False)",
            qk_norm=False,
            attention_bias=False,
            slides=True,
        ),
        "mixtral": Family(
            "modular_mixtral.py MixtralAttention (MistralAttention: bias=False, no q/k "
            "norm), MixtralSparseMoeBlock (gate Linear(H, E), softmax, top-k, renormalised; "
            "no shared expert); configuration_mixtral.py MixtralConfig (sliding_window=None, "
            "head_dim=None)",
            qk_norm=False,
            attention_bias=False,
            slides=True,
        ),
        "glm4_moe": Family(
            "modeling_glm4_moe.py Glm4MoeAttention (q/k/v bias=config.attention_bias, o "
            "bias=False; q_norm/k_norm = RMSNorm(head_dim) under use_qk_norm), Glm4MoeMoE "
            "(sigmoid Glm4MoeTopkRouter, n_shared_experts ungated), Glm4MoeDecoderLayer "
            "(MoE from first_k_dense_replace); configuration_glm4_moe.py Glm4MoeConfig",
            qk_norm=False,
            qk_norm_field="use_qk_norm",
            shared_expert_gate=False,
        ),
        "olmo2": Family(
            "modeling_olmo2.py Olmo2Attention (bias=config.attention_bias; q_norm = "
            "RMSNorm(heads x head_dim), k_norm = RMSNorm(kv_heads x head_dim)), Olmo2MLP "
            "(bias=False), Olmo2DecoderLayer (post_attention_layernorm and "
            "post_feedforward_layernorm on the outputs, no input norms); "
            "configuration_olmo2.py Olmo2Config",
            qk_norm=True,
            sandwich_norms=True,
            pre_norms=False,
            qk_norm_projection=True,
        ),
        "olmo3": Family(
            "modular_olmo3.py Olmo3Attention (Olmo2Attention's, a sliding window on "
            "layer_types' sliding layers), Olmo3DecoderLayer (Olmo2DecoderLayer), "
            "Olmo3Config (sliding_window=4096, layer_types: 3 sliding of 4)",
            qk_norm=True,
            sandwich_norms=True,
            pre_norms=False,
            qk_norm_projection=True,
            window=4096,
        ),
        "qwen2_moe": Family(
            "modular_qwen2_moe.py Qwen2MoeAttention (LlamaAttention's; q/k/v "
            "bias=config.qkv_bias, o bias=False, no q/k norm), Qwen2MoeSparseMoeBlock "
            "(Qwen2MoeTopKRouter: softmax over every expert, top-k, renormalised under "
            "norm_topk_prob; a shared_expert Qwen2MoeMLP of shared_expert_intermediate_size "
            "scaled by sigmoid(shared_expert_gate), Linear(H, 1)), Qwen2MoeDecoderLayer "
            "(the sparse block where the layer is not in mlp_only_layers and (i + 1) % "
            "decoder_sparse_step == 0); configuration_qwen2_moe.py Qwen2MoeConfig "
            "(qkv_bias=True, tie_word_embeddings=False)",
            qk_norm=False,
            bias_field="qkv_bias",
            attention_bias_default=True,
        ),
        "olmoe": Family(
            "modular_olmoe.py OlmoeAttention (LlamaAttention's, bias=config.attention_bias; "
            "q_norm = RMSNorm(hidden_size), k_norm = RMSNorm(hidden_size / heads x "
            "kv_heads) over the projections, clip_qkv), OlmoeSparseMoeBlock (gate Linear(H, "
            "E), softmax over every expert, top-k, renormalised under norm_topk_prob; "
            "num_experts OlmoeMLP of intermediate_size; no shared expert), "
            "OlmoeDecoderLayer (LlamaDecoderLayer's pre-norms, the sparse block in every "
            "layer); configuration_olmoe.py OlmoeConfig",
            qk_norm=True,
            qk_norm_projection=True,
        ),
        "gemma": Family(
            "modular_gemma.py GemmaAttention (LlamaAttention's: bias=config.attention_bias, "
            "no q/k norm), GemmaMLP (LlamaMLP's, ACT2FN[config.hidden_act]), GemmaRMSNorm "
            "(weight used as 1 + w: H parameters as any RMSNorm), GemmaModel (LlamaModel's "
            "pre-norms; the embedding scaled by sqrt(H)); configuration_gemma.py "
            "GemmaConfig (head_dim=256, hidden_act=gelu_pytorch_tanh, "
            "tie_word_embeddings=True)",
            qk_norm=False,
            tied=True,
            head_dim=256,
            activation="gelu_pytorch_tanh",
        ),
        "starcoder2": Family(
            "modeling_starcoder2.py Starcoder2Attention (q/k/v/o bias=config.use_bias, no "
            "q/k norm, sliding_window=config.sliding_window on every layer), Starcoder2MLP "
            "(c_fc, ACT2FN[hidden_act], c_proj: not gated, bias=config.use_bias), "
            "Starcoder2DecoderLayer and Starcoder2Model (nn.LayerNorm input, post-attention "
            "and final norms: weight and bias); configuration_starcoder2.py "
            "Starcoder2Config (use_bias=True, sliding_window=None, "
            "hidden_act=gelu_pytorch_tanh, tie_word_embeddings=True)",
            qk_norm=False,
            bias_field="use_bias",
            attention_bias_default=True,
            mlp_bias=None,
            mlp_bias_field="use_bias",
            mlp_bias_default=True,
            tied=True,
            activation="gelu_pytorch_tanh",
            slides=True,
            norm="layernorm",
            gated_mlp=False,
        ),
        "deepseek_v2": Family(
            "modular_deepseek_v2.py DeepseekV2Attention (q_proj where q_lora_rank is null, "
            "else q_a_proj, q_a_layernorm and q_b_proj; kv_a_proj_with_mqa, kv_a_layernorm, "
            "kv_b_proj; bias=config.attention_bias on q_a, kv_a and o), DeepseekV2Moe (gate "
            "Linear(H, E, bias=False), no e_score_correction_bias; softmax over every expert "
            "in fp32, top-k, scaled by routed_scaling_factor, not renormalised: "
            "norm_topk_prob is not read; one ungated shared DeepseekV2MLP of "
            "moe_intermediate_size x n_shared_experts; Qwen2MoeExperts' fused gate_up_proj "
            "and down_proj, no biases), DeepseekV2DecoderLayer (LlamaDecoderLayer's "
            "pre-norms; the MoE block from first_k_dense_replace on, moe_layer_freq not "
            "read); DeepseekV2Config (q_lora_rank=1536, n_routed_experts=64, "
            "n_shared_experts=2, moe_intermediate_size=1407, first_k_dense_replace=0, "
            "tie_word_embeddings=False)",
            qk_norm=False,
            shared_expert_gate=False,
        ),
        "ernie4_5": Family(
            "modular_ernie4_5.py Ernie4_5Attention (LlamaAttention's, no q/k norm; q/k/v/o "
            "bias=config.use_bias), Ernie4_5MLP (LlamaMLP's gate/up/down, "
            "bias=config.use_bias), LlamaDecoderLayer's pre-norms; configuration_ernie4_5.py "
            "Ernie4_5Config (use_bias=False, head_dim=128, tie_word_embeddings=True)",
            qk_norm=False,
            bias_field="use_bias",
            mlp_bias=None,
            mlp_bias_field="use_bias",
            tied=True,
            head_dim=128,
        ),
        "nemotron_h": Family(
            "modeling_nemotron_h.py NemotronHAttention (Jamba's: no q/k norm, no rope), "
            "NemotronHMLP (up/down, relu2), NemotronHMoE (no shared-expert gate), "
            "NemotronHMamba2Mixer; configuration_nemotron_h.py NemotronHConfig (head_dim=128, "
            "tie_word_embeddings=False): read by cpmem.model.hf_nemotron",
            qk_norm=False,
            head_dim=128,
            activation="relu2",
            shared_expert_gate=False,
        ),
    }
)
"""Every ``model_type`` cpmem reads, by what its modeling class builds."""

UNPRICED: Mapping[str, str] = MappingProxyType(
    {
        **dict.fromkeys(
            ("llama4", "llama4_text"),
            "Llama4TextConfig's no_rope_layers (attention without rope: fewer saved "
            "tensors), attention_chunk_size (chunked attention on the rope layers), "
            "weightless L2 q/k norms and interleave_moe_layer_step's top-1 router that "
            "scales the expert input are layers cpmem's kinds do not express",
        ),
        **dict.fromkeys(
            ("gemma3n", "gemma3n_text"),
            "Gemma3n's per-layer embeddings, AltUp and LAuReL blocks, shared KV caches and "
            "activation sparsity are layers cpmem's kinds do not express",
        ),
        **dict.fromkeys(
            ("granite", "granitemoe", "granitemoeshared", "granitemoehybrid"),
            "Granite's LM head divides the logits by logits_scaling (a logits-sized copy "
            "the head pricing does not hold)",
        ),
        "smollm3": "SmolLM3Config's no_rope_layers: every no_rope_layer_interval-th layer "
        "attends without rope and keeps fewer tensors than the rope layers cpmem prices",
        "mistral3": "a multimodal wrapper whose pixtral vision tower cpmem does not count; "
        "its text_config (model_type mistral) prices as a config of its own",
        "ernie4_5_moe": "Ernie4_5_MoeSparseMoeBlock's router keeps the fp32 softmax of every "
        "expert, picks the top-k on those scores plus moe_statics.e_score_correction_bias "
        "and divides the gathered weights by their sum clamped at moe_norm_min: a softmax "
        "normalised like DeepSeek-V3's sigmoid, which none of cpmem's router kinds is "
        "(modular_ernie4_5_moe.py)",
    }
)
"""``model_type`` values surveyed and not priced, with the reason (``load_config`` names
it): their layers differ from every kind cpmem prices."""


@dataclass(frozen=True)
class Wrapper:
    """A multimodal ``model_type`` whose language model is its ``text_config``.

    ``text_defaults``: the text config class's defaults of the fields cpmem reads. A
    wrapper's saved ``text_config`` holds only the fields that differ from them
    (transformers' ``PretrainedConfig.to_diff_dict`` compares a sub-config with its class's
    defaults), so the published Gemma 3 4B ``text_config`` names no heads at all.
    ``vision``: how ``cpmem.model.vision`` counts the tower of its ``vision_config``."""

    text_family: str
    source: str
    vision: str
    text_defaults: Mapping[str, Any] = field(default_factory=dict)


WRAPPERS: Mapping[str, Wrapper] = MappingProxyType(
    {
        "gemma3": Wrapper(
            "gemma3_text",
            "configuration_gemma3.py Gemma3Config, Gemma3TextConfig.__init__ defaults",
            "siglip",
            MappingProxyType(
                {
                    "vocab_size": 262_208,
                    "hidden_size": 2304,
                    "intermediate_size": 9216,
                    "num_hidden_layers": 26,
                    "num_attention_heads": 8,
                    "num_key_value_heads": 4,
                    "head_dim": 256,
                    "hidden_activation": "gelu_pytorch_tanh",
                    "max_position_embeddings": 131_072,
                    "tie_word_embeddings": True,
                    "attention_bias": False,
                    "sliding_window": 4096,
                    "sliding_window_pattern": 6,
                    "final_logit_softcapping": None,
                    "attn_logit_softcapping": None,
                }
            ),
        ),
        "qwen3_5": Wrapper(
            "qwen3_5_text",
            "configuration_qwen3_5.py Qwen3_5Config, Qwen3_5TextConfig defaults",
            "qwen3_5",
            MappingProxyType(
                {
                    "vocab_size": 248_320,
                    "hidden_size": 4096,
                    "intermediate_size": 12288,
                    "num_hidden_layers": 32,
                    "num_attention_heads": 16,
                    "num_key_value_heads": 4,
                    "hidden_act": "silu",
                    "max_position_embeddings": 32768,
                    "tie_word_embeddings": False,
                    "attention_bias": False,
                    "head_dim": 256,
                    "linear_conv_kernel_dim": 4,
                    "linear_key_head_dim": 128,
                    "linear_value_head_dim": 128,
                    "linear_num_key_heads": 16,
                    "linear_num_value_heads": 32,
                    "full_attention_interval": 4,
                }
            ),
        ),
        "qwen3_5_moe": Wrapper(
            "qwen3_5_moe_text",
            "configuration_qwen3_5_moe.py Qwen3_5MoeConfig, Qwen3_5MoeTextConfig defaults",
            "qwen3_5",
            MappingProxyType(
                {
                    "vocab_size": 248_320,
                    "hidden_size": 2048,
                    "num_hidden_layers": 40,
                    "num_attention_heads": 16,
                    "num_key_value_heads": 2,
                    "hidden_act": "silu",
                    "max_position_embeddings": 32768,
                    "tie_word_embeddings": False,
                    "attention_bias": False,
                    "head_dim": 256,
                    "linear_conv_kernel_dim": 4,
                    "linear_key_head_dim": 128,
                    "linear_value_head_dim": 128,
                    "linear_num_key_heads": 16,
                    "linear_num_value_heads": 32,
                    "moe_intermediate_size": 512,
                    "shared_expert_intermediate_size": 512,
                    "num_experts_per_tok": 8,
                    "num_experts": 256,
                    "full_attention_interval": 4,
                }
            ),
        ),
    }
)
"""The multimodal wrappers read through their ``text_config``."""
