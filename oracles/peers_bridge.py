"""Megatron-Bridge's ``estimate_training_memory``, restated as a peer for Megatron-LM's runs.

Source: NVIDIA-NeMo/Megatron-Bridge
``src/megatron/bridge/training/utils/theoretical_memory_utils.py`` at
``BRIDGE_SOURCE_COMMIT`` (067f987d, the mirror's HEAD; the file's last change there is
f43e405a, "account for uneven PP in memory estimate"). Restated from the formula, not
copied: the figures are the source's float arithmetic in the same order, so they agree
with it to the byte. An oracle: this module never imports cpmem.

``bridge_estimate_training_memory`` takes Bridge's own configuration as a nested dict
shaped like its ``ConfigContainer`` (``model``: the ``GPTModelProvider`` fields it
reads, ``train``: ``micro_batch_size``, ``optimizer``: ``use_distributed_optimizer``,
and ``data_parallel_size``); ``bridge_config_from_megatron_args`` builds that dict from
Megatron-LM's resolved arguments (the dict ``oracles.peers.megatron_args_theoretical``
reads), and ``bridge_args_theoretical`` does both, for the Megatron-LM tier's peers
section.

What the formula counts, and how it differs from Megatron-LM's ``report_theoretical_memory``
(``oracles.peers``), which it descends from:

- weights and Adam state: 18 B a parameter, or with the distributed optimizer ``6 +
  12/shard``; the dense shard is ``dp x cp`` (Megatron-LM's: ``dp``), the routed experts'
  ``(dp·tp·cp) // (ep·etp)``;
- every layer's norms are ``4h`` and the final norm ``2h`` (LayerNorm's weight and bias,
  whatever ``normalization`` is: RMSNorm is counted with a bias), all TP-split with the
  layer (Megatron-LM holds them whole); no router weights, no shared-expert gate, no
  multi-latent attention term (the attention is ``2h²(1 + groups/heads)(kv·heads/h)``
  for any attention);
- activations: always Korthikanti et al.'s sequence-parallel + selective-recompute row,
  ``s·b·h·(18 + 4·r)`` a layer, with ``r`` the mean FFN width over ``h`` (a MoE layer's
  width ``moe_ffn·topk + shared``), over the layers and the MTP layers, the embedding's
  ``8·s·b·pp + s·b·h·pp``, the same schedule factors, at PP 1 ``4·s·b·h·(1 + V/h)``,
  all over ``tp x cp``. No branch for full recompute, no recompute or no SP;
  ``report_theoretical_memory`` prints the activation term only under SP with
  selective recompute (``activation_reported``), ``estimate_training_memory`` returns it
  always.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BRIDGE_SOURCE_COMMIT",
    "bridge_args_theoretical",
    "bridge_config_from_megatron_args",
    "bridge_estimate_training_memory",
]

BRIDGE_SOURCE_COMMIT = "067f987df03b8355b03192d88d70f1709fedf51a"
ADAM_BYTES = 18.0  # _bytes_per_parameter: no distributed optimizer
DIST_OPT_UNSHARDED_BYTES = 6.0  # the bf16 weight and the fp32 main grad on every rank
DIST_OPT_SHARDED_BYTES = 12.0  # the fp32 master copy and two moments, over the shard


def _field(section: dict[str, Any], name: str, where: str) -> Any:
    """A field the source reads without a default, or a KeyError naming it."""
    try:
        return section[name]
    except KeyError:
        raise KeyError(
            f"bridge_estimate_training_memory: missing {where}.{name} (the source reads it "
            "as an attribute without a default)"
        ) from None


def _positive(section: dict[str, Any], name: str, default: int) -> int:
    """The source's ``_positive_int_attr``: absent or None is ``default``, < 1 refused."""
    value = section.get(name)
    if value is None:
        return default
    value = int(value)
    if value <= 0:
        raise ValueError(f"{name} must be positive (got {value})")
    return value


def _non_negative(section: dict[str, Any], name: str, default: int) -> int:
    """The source's ``_optional_positive_int_attr``: absent or None is ``default``, 0 kept."""
    value = section.get(name)
    if value is None:
        return default
    value = int(value)
    if value < 0:
        raise ValueError(f"{name} must be non-negative (got {value})")
    return value


def _has_moe(model: dict[str, Any]) -> bool:
    experts = model.get("num_moe_experts")
    return experts is not None and experts > 0


def _moe_pattern(model: dict[str, Any]) -> list[bool]:
    """Which layers are MoE layers, the MTP layers appended as copies of the last."""
    layers = _positive(model, "num_layers", 1)
    if not _has_moe(model):
        pattern = [False] * layers
    else:
        freq = model.get("moe_layer_freq", 1)
        if isinstance(freq, int):
            if freq <= 0:
                raise ValueError("moe_layer_freq must be positive")
            pattern = [i % freq == 0 for i in range(layers)]
        elif isinstance(freq, list | tuple):
            if len(freq) != layers:
                raise ValueError(f"moe_layer_freq has {len(freq)} entries for num_layers={layers}")
            pattern = [bool(x) for x in freq]
        else:
            raise ValueError(f"moe_layer_freq={freq!r}: an int, a list or a tuple")
    mtp = model.get("mtp_num_layers") or 0
    if mtp > 0:
        pattern += [pattern[-1]] * mtp
    return pattern


def _vocab(model: dict[str, Any]) -> int:
    """The vocabulary: padded to ``make_vocab_size_divisible_by x tp`` unless
    ``should_pad_vocab`` is False (absent: padded, the source's ``getattr`` default)."""
    vocab = _field(model, "vocab_size", "model")
    if not model.get("should_pad_vocab", True):
        return int(vocab)
    multiple = _field(model, "make_vocab_size_divisible_by", "model") * _field(
        model, "tensor_model_parallel_size", "model"
    )
    return -(-int(vocab) // multiple) * multiple


def _projections(model: dict[str, Any]) -> float:
    """MLP projections a parameter count multiplies: 3 gated with SiLU (SwiGLU), else 2."""
    swiglu = model.get("gated_linear_unit", False) and model.get("activation_func") == "silu"
    return 3.0 if swiglu else 2.0


def _parameters(model: dict[str, Any], pattern: list[bool]) -> dict[str, Any]:
    """Each layer's TP-split and routed-expert parameters, the final norm, the embedding."""
    h = _field(model, "hidden_size", "model")
    heads = _field(model, "num_attention_heads", "model")
    width_ratio = _field(model, "kv_channels", "model") * heads / h
    groups = _field(model, "num_query_groups", "model") or heads
    attention = 2 * h * h * ((1 + (groups / heads)) * width_ratio)
    norms = 4 * h
    final_norm = 2 * h
    projections = _projections(model)
    dense_mlp = projections * h * _field(model, "ffn_hidden_size", "model")
    shared = projections * h * _non_negative(model, "moe_shared_expert_intermediate_size", 0)
    routed = 0.0
    latent_proj = 0.0
    if _has_moe(model) and any(pattern):
        moe_ffn = _non_negative(
            model, "moe_ffn_hidden_size", _field(model, "ffn_hidden_size", "model")
        )
        latent = model.get("moe_latent_size")
        if latent is None:
            routed = projections * h * moe_ffn * model["num_moe_experts"]
        else:
            routed = projections * latent * moe_ffn * model["num_moe_experts"]
            latent_proj = 2 * h * latent
    dense_by_layer = [
        attention + norms + (shared + latent_proj if moe else dense_mlp) for moe in pattern
    ]
    routed_by_layer = [routed if moe else 0.0 for moe in pattern]
    embedding = h * _vocab(model)
    shared_embedding = _field(model, "share_embeddings_and_output_weights", "model")
    embeddings = embedding if shared_embedding else 2 * embedding
    return {
        "dense_by_layer": dense_by_layer,
        "routed_by_layer": routed_by_layer,
        "dense": sum(dense_by_layer) + final_norm,
        "routed": sum(routed_by_layer),
        "final_norm": final_norm,
        "embedding": embedding,
        "embeddings": embeddings,
    }


def _uneven_stage_layers(model: dict[str, Any], pp: int) -> list[int] | None:
    """The layers of each stage when a first or last stage is given its own count."""
    first = model.get("num_layers_in_first_pipeline_stage")
    last = model.get("num_layers_in_last_pipeline_stage")
    if first is None and last is None:
        return None
    if pp <= 1:
        raise ValueError("uneven pipeline stages need pipeline_model_parallel_size > 1")
    left, stages = _positive(model, "num_layers", 1), pp
    if first is not None:
        first = _positive(model, "num_layers_in_first_pipeline_stage", 1)
        left, stages = left - first, stages - 1
    if last is not None:
        last = _positive(model, "num_layers_in_last_pipeline_stage", 1)
        left, stages = left - last, stages - 1
    if stages == 0:
        if left != 0:
            raise ValueError("the uneven stages' layer counts do not add up to num_layers")
        middle = 0
    else:
        if left <= 0 or left % stages != 0:
            raise ValueError("the layers left do not divide evenly over the middle stages")
        middle = left // stages
    counts = [middle] * pp
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return counts


def _stage_layer_indices(model: dict[str, Any], counts: list[int]) -> list[list[int]]:
    """Which layers each stage holds: in order, or round-robin over the virtual chunks."""
    if model.get("virtual_pipeline_model_parallel_size") is None:
        out, start = [], 0
        for n in counts:
            out.append(list(range(start, start + n)))
            start += n
        return out
    vpp = _positive(model, "virtual_pipeline_model_parallel_size", 1)
    if any(n % vpp for n in counts):
        raise ValueError("each uneven stage's layer count must divide over the virtual chunks")
    indices: list[list[int]] = [[] for _ in counts]
    start = 0
    for _ in range(vpp):
        for stage, n in enumerate(counts):
            indices[stage].extend(range(start, start + n // vpp))
            start += n // vpp
    return indices


def _dense_per_gpu(model: dict[str, Any], p: dict[str, Any], pp: int, tp: int) -> float:
    """The dense and embedding parameters on the most loaded (TP, PP) shard."""
    counts = _uneven_stage_layers(model, pp)
    if counts is None:
        embedding = p["embedding"] / tp
        if not model["share_embeddings_and_output_weights"] and pp == 1:
            embedding += p["embedding"] / tp  # the output layer, on the same stage
        return p["dense"] / (pp * tp) + embedding
    by_stage = [
        sum(p["dense_by_layer"][i] for i in stage) for stage in _stage_layer_indices(model, counts)
    ]
    layers = _positive(model, "num_layers", 1)
    by_stage[-1] += sum(p["dense_by_layer"][layers:])  # the MTP layers
    by_stage[-1] += p["final_norm"]
    by_stage[0] += p["embedding"]
    by_stage[-1] += p["embedding"]
    return max(by_stage) / tp


def _routed_per_gpu(model: dict[str, Any], p: dict[str, Any], pp: int, ep: int, etp: int) -> float:
    """The routed experts' parameters on the most loaded (PP, EP, ETP) shard."""
    counts = _uneven_stage_layers(model, pp)
    if counts is None:
        return p["routed"] / (pp * ep * etp)
    by_stage = [
        sum(p["routed_by_layer"][i] for i in stage) for stage in _stage_layer_indices(model, counts)
    ]
    by_stage[-1] += sum(p["routed_by_layer"][_positive(model, "num_layers", 1) :])
    return max(by_stage) / (ep * etp)


def _bytes_per_parameter(config: dict[str, Any], shard: int) -> float:
    if not _field(config, "optimizer", "config").get("use_distributed_optimizer", False):
        return ADAM_BYTES
    return DIST_OPT_UNSHARDED_BYTES + (DIST_OPT_SHARDED_BYTES / max(1, shard))


def _ffn_ratio(model: dict[str, Any], pattern: list[bool]) -> float:
    """The layers' mean FFN width over ``h`` (a MoE layer: ``moe_ffn·topk + shared``)."""
    total = len(pattern)
    if total == 0:
        return 0.0
    moe_layers = sum(pattern)
    ffn = _field(model, "ffn_hidden_size", "model")
    dense = (total - moe_layers) * ffn
    moe = 0.0
    if _has_moe(model) and moe_layers > 0:
        topk = _non_negative(
            model, "moe_router_topk", _non_negative(model, "num_experts_routed_to", 1)
        )
        moe_ffn = _non_negative(model, "moe_ffn_hidden_size", ffn)
        shared = _non_negative(model, "moe_shared_expert_intermediate_size", 0)
        moe = moe_layers * ((moe_ffn * topk) + shared)
    return (dense + moe) / (total * _field(model, "hidden_size", "model"))


def _activation_bytes(config: dict[str, Any], num_microbatches: int | None) -> float:
    """The first stage's activations (Korthikanti et al. 2022, Table 2, SP + selective)."""
    model = _field(config, "model", "config")
    tp = _positive(model, "tensor_model_parallel_size", 1)
    pp = _positive(model, "pipeline_model_parallel_size", 1)
    cp = _positive(model, "context_parallel_size", 1)
    vpp = model.get("virtual_pipeline_model_parallel_size")
    pattern = _moe_pattern(model)
    ratio = _ffn_ratio(model, pattern)
    s = _field(model, "seq_length", "model")
    b = _field(_field(config, "train", "config"), "micro_batch_size", "train")
    h = _field(model, "hidden_size", "model")
    act = s * b * h * (18 + (4 * ratio))  # one layer
    act *= len(pattern)  # the layers and the MTP layers
    act += 8 * s * b * pp  # int64 token ids, pp micro-batches in flight
    act += s * b * h * pp  # the embedding's dropout mask (1 B), pp micro-batches
    if vpp is not None:
        act *= 1 + ((pp - 1) / (pp * vpp))  # the interleaved schedule's penalty
    if vpp is None and pp > 1 and num_microbatches is not None:
        act *= min(1, num_microbatches / pp)  # 1F1B with fewer micro-batches than stages
    if pp == 1:  # the output layer's input and the cross entropy, fp32
        act += s * b * h * 4 * (1 + (_vocab(model) / h))
    return act / (tp * cp)


def bridge_estimate_training_memory(
    config: dict[str, Any], num_microbatches: int | None = None
) -> dict[str, float]:
    """Megatron-Bridge's ``estimate_training_memory(config, num_microbatches)`` (with its
    default ``include_activation=True``), in bytes on the most loaded GPU.

    ``config`` is shaped like Bridge's ``ConfigContainer``: ``config["model"]`` holds the
    model provider's fields (``num_layers``, ``hidden_size``, ``num_attention_heads``,
    ``kv_channels``, ``num_query_groups``, ``ffn_hidden_size``, ``gated_linear_unit``,
    ``activation_func`` as its name (``"silu"`` for SwiGLU), ``num_moe_experts``,
    ``moe_layer_freq``, ``moe_ffn_hidden_size``, ``moe_shared_expert_intermediate_size``,
    ``moe_router_topk``, ``moe_latent_size``, ``mtp_num_layers``,
    ``share_embeddings_and_output_weights``, ``vocab_size``, ``should_pad_vocab``,
    ``make_vocab_size_divisible_by``, ``tensor_model_parallel_size``,
    ``pipeline_model_parallel_size``, ``virtual_pipeline_model_parallel_size``,
    ``context_parallel_size``, ``expert_model_parallel_size``,
    ``expert_tensor_parallel_size``, ``num_layers_in_first_pipeline_stage``,
    ``num_layers_in_last_pipeline_stage``, ``seq_length``, and for
    ``activation_reported`` ``sequence_parallel`` and ``recompute_granularity``);
    ``config["train"]["micro_batch_size"]``;
    ``config["optimizer"]["use_distributed_optimizer"]``; ``config["data_parallel_size"]``
    (``world // (tp·pp·cp)``). A field the source reads with ``getattr`` takes the
    source's default when absent; one it reads as a plain attribute raises KeyError
    naming it.

    Returns ``weight_and_optimizer_bytes`` (the dense and routed-expert components'
    sum), ``activation_bytes``, ``total_bytes`` (their sum, the source's
    ``total_memory_bytes``) and what Bridge reports apart: ``dense_bytes``,
    ``routed_expert_bytes`` (0 without routed experts: the source has no such
    component then), each component's ``*_parameters_per_gpu`` and
    ``*_bytes_per_parameter``, ``total_parameters`` (the global count: layers, final
    norm, routed experts, the embedding and an untied output layer), and
    ``activation_reported`` (1.0 where ``report_theoretical_memory`` prints the
    activation term: ``sequence_parallel`` and ``recompute_granularity ==
    "selective"``; 0.0 where it prints the weights alone).
    """
    model = _field(config, "model", "config")
    pattern = _moe_pattern(model)
    p = _parameters(model, pattern)
    tp = _positive(model, "tensor_model_parallel_size", 1)
    pp = _positive(model, "pipeline_model_parallel_size", 1)
    cp = _positive(model, "context_parallel_size", 1)
    ep = _positive(model, "expert_model_parallel_size", 1)
    etp = _positive(model, "expert_tensor_parallel_size", 1)
    dp = _positive(config, "data_parallel_size", 1)

    dense_params = _dense_per_gpu(model, p, pp, tp)
    dense_bpp = _bytes_per_parameter(config, dp * cp)
    dense_bytes = dense_params * dense_bpp
    routed_params = routed_bpp = routed_bytes = 0.0
    weights = dense_bytes
    if p["routed"] > 0:
        routed_params = _routed_per_gpu(model, p, pp, ep, etp)
        routed_bpp = _bytes_per_parameter(config, max(1, (dp * tp * cp) // max(1, ep * etp)))
        routed_bytes = routed_params * routed_bpp
        weights = dense_bytes + routed_bytes
    activations = _activation_bytes(config, num_microbatches)
    reported = bool(model.get("sequence_parallel")) and (
        model.get("recompute_granularity") == "selective"
    )
    return {
        "weight_and_optimizer_bytes": weights,
        "activation_bytes": activations,
        "total_bytes": weights + activations,
        "dense_bytes": dense_bytes,
        "routed_expert_bytes": routed_bytes,
        "dense_parameters_per_gpu": dense_params,
        "routed_expert_parameters_per_gpu": routed_params,
        "dense_bytes_per_parameter": dense_bpp,
        "routed_expert_bytes_per_parameter": routed_bpp,
        "total_parameters": p["dense"] + p["routed"] + p["embeddings"],
        "activation_reported": 1.0 if reported else 0.0,
    }


def bridge_config_from_megatron_args(args: dict[str, Any]) -> dict[str, Any]:
    """The Bridge configuration of the run Megatron-LM's resolved arguments describe.

    ``args`` is keyed by Megatron-LM's argparse destination names, as
    ``oracles.peers.megatron_args_theoretical`` reads them, plus ``context_parallel_size``
    and ``moe_router_topk``. The mapping: ``num_experts`` -> ``num_moe_experts``;
    ``swiglu`` -> ``gated_linear_unit`` with ``activation_func="silu"`` (else
    ``"gelu"``: any ungated activation is two projections to the formula);
    ``untie_embeddings_and_output_weights`` -> not ``share_embeddings_and_output_weights``;
    ``num_query_groups`` where ``group_query_attention``, else the head count (what
    megatron-core's config holds without GQA); the vocabulary as Megatron-LM built it
    (``padded_vocab_size``, with ``should_pad_vocab=False``: padding it again would
    change nothing); ``decoder_first_pipeline_num_layers`` /
    ``decoder_last_pipeline_num_layers`` (None when absent) ->
    ``num_layers_in_first_pipeline_stage`` / ``..._last_...``; the parallel sizes,
    ``seq_length``, ``micro_batch_size``, ``use_distributed_optimizer``,
    ``data_parallel_size``, ``sequence_parallel`` and ``recompute_granularity`` by the
    same name. Not carried: ``normalization``, ``add_bias_linear``,
    ``multi_latent_attention`` and ``hybrid_layer_pattern`` (the formula reads none of
    them).
    """

    def arg(key: str) -> Any:
        try:
            return args[key]
        except KeyError:
            raise KeyError(
                f"bridge_config_from_megatron_args: missing Megatron-LM argument {key!r}"
            ) from None

    gqa = arg("group_query_attention")
    model = {
        "num_layers": arg("num_layers"),
        "hidden_size": arg("hidden_size"),
        "num_attention_heads": arg("num_attention_heads"),
        "kv_channels": arg("kv_channels"),
        "num_query_groups": arg("num_query_groups") if gqa else arg("num_attention_heads"),
        "ffn_hidden_size": arg("ffn_hidden_size"),
        "gated_linear_unit": bool(arg("swiglu")),
        "activation_func": "silu" if arg("swiglu") else "gelu",
        "num_moe_experts": arg("num_experts"),
        "moe_layer_freq": arg("moe_layer_freq") if arg("num_experts") is not None else 1,
        "moe_ffn_hidden_size": arg("moe_ffn_hidden_size") if arg("num_experts") else None,
        "moe_shared_expert_intermediate_size": arg("moe_shared_expert_intermediate_size"),
        "moe_router_topk": arg("moe_router_topk") if arg("num_experts") else None,
        "moe_latent_size": arg("moe_latent_size"),
        "mtp_num_layers": arg("mtp_num_layers"),
        "share_embeddings_and_output_weights": not arg("untie_embeddings_and_output_weights"),
        "vocab_size": arg("padded_vocab_size"),
        "should_pad_vocab": False,
        "make_vocab_size_divisible_by": 128,
        "tensor_model_parallel_size": arg("tensor_model_parallel_size"),
        "pipeline_model_parallel_size": arg("pipeline_model_parallel_size"),
        "virtual_pipeline_model_parallel_size": arg("virtual_pipeline_model_parallel_size"),
        "context_parallel_size": arg("context_parallel_size"),
        "expert_model_parallel_size": arg("expert_model_parallel_size"),
        "expert_tensor_parallel_size": arg("expert_tensor_parallel_size"),
        "num_layers_in_first_pipeline_stage": args.get("decoder_first_pipeline_num_layers"),
        "num_layers_in_last_pipeline_stage": args.get("decoder_last_pipeline_num_layers"),
        "seq_length": arg("seq_length"),
        "sequence_parallel": bool(arg("sequence_parallel")),
        "recompute_granularity": arg("recompute_granularity"),
    }
    return {
        "model": model,
        "train": {"micro_batch_size": arg("micro_batch_size")},
        "optimizer": {"use_distributed_optimizer": bool(arg("use_distributed_optimizer"))},
        "data_parallel_size": arg("data_parallel_size"),
    }


def bridge_args_theoretical(args: dict[str, Any]) -> dict[str, float]:
    """``bridge_estimate_training_memory`` for a run given by Megatron-LM's resolved
    arguments (``bridge_config_from_megatron_args``), with ``num_microbatches`` from
    them as Bridge's training loop passes ``get_num_microbatches()``."""
    return bridge_estimate_training_memory(
        bridge_config_from_megatron_args(args), args["num_microbatches"]
    )
