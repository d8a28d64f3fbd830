"""The layer stack a Megatron-LM run builds, read from its arguments: which mixer and
which feed-forward block each layer has, the multi-token-prediction (MTP) depths after
it, and the shapes of the kinds in it (``megatron_stack``).

- A hybrid run (``--hybrid-layer-pattern``, ``pretrain_hybrid.py``'s ``HybridModel``):
  one layer per symbol of the main pattern (``cpmem.megatron.hybrid_pattern``), the
  pattern after each ``/`` one MTP depth (``HybridModel`` builds MTP from the pattern
  alone; ``--mtp-num-layers`` without one builds none, arguments.py:896-907).
- A GPT run (``pretrain_gpt.py``'s ``GPTModel``): ``--num-layers`` transformer layers,
  each attention and a dense MLP or, with ``--num-experts``, an MoE block where
  ``--moe-layer-freq`` says (``gpt_layer_specs.py:643-671``); ``--mtp-num-layers`` depths
  of one transformer layer each, of the decoder's last layer's kind
  (``gpt_builders.py:56-84``: "Use spec of the last layer in decoder block as spec of the
  transformer layer in MTP").
- Each MTP depth (``multi_token_prediction.py`` ``MultiTokenPredictionLayer``): its
  layers, the embedding's and the hidden state's norms, ``eh_proj`` (``2H -> H``,
  column-parallel) and a final norm; ``--mtp-use-repeated-layer`` builds one such depth
  and runs it at every depth (``MultiTokenPredictionBlock._build_layers``).
- Mamba-2 (``MambaMixer``, ``ssm/mamba_mixer.py:174-251``): ``--mamba-num-heads`` heads of
  ``--mamba-head-dim``, else ``2H / head_dim`` (its ``expand=2``); a 4-wide causal conv
  (``d_conv=4``) and the chunked scan's 128 (``chunk_size=128``), which the hybrid
  stack's ``MambaLayer`` leaves at their defaults (``mamba_layer.py:89-97``).
- Latent attention (``--multi-latent-attention``, or a ``+`` in the pattern):
  ``--q-lora-rank`` (None: a plain query projection), ``--kv-lora-rank``, the per-head
  ``--qk-head-dim`` (no rope), ``--qk-pos-emb-head-dim`` (rope) and ``--v-head-dim``.
- Gated DeltaNet (``G``): the ``--linear-*`` heads, dims and conv kernel
  (``transformer_config.py:370-382``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cpmem.megatron.fields import MegatronArgs
from cpmem.megatron.hybrid_pattern import HybridPattern, parse_hybrid_pattern
from cpmem.model.geometry import MixerKind, MlpKind

MAMBA_EXPAND = 2
"""``MambaMixer``'s ``expand`` (ssm/mamba_mixer.py:181): the inner width is ``2H`` where
no head count is given."""
MAMBA_CONV_KERNEL = 4
"""``MambaMixer``'s ``d_conv`` (ssm/mamba_mixer.py:179)."""
MAMBA_CHUNK = 128
"""``MambaMixer``'s ``chunk_size`` (ssm/mamba_mixer.py:194)."""


@dataclass(frozen=True)
class MegatronStack:
    """The layers a run builds: the decoder's, one MTP depth's, the depths and whether
    every depth runs one set of weights."""

    mixers: tuple[MixerKind, ...]
    mlps: tuple[MlpKind, ...]
    mtp_mixers: tuple[MixerKind, ...] = ()
    mtp_mlps: tuple[MlpKind, ...] = ()
    mtp_depths: int = 0
    mtp_shared: bool = False


def hybrid_pattern(args: MegatronArgs) -> HybridPattern | None:
    """The run's parsed hybrid pattern (None: a GPT run). The pattern is assumed valid
    (``check_megatron_args`` names its problems)."""
    text = args.hybrid_layer_pattern or args.hybrid_override_pattern
    if text is None:
        return None
    parsed = parse_hybrid_pattern(text)
    assert isinstance(parsed, HybridPattern), parsed
    return parsed


def moe_layers(args: MegatronArgs) -> tuple[bool, ...]:
    """Which of a GPT run's layers are MoE layers (``gpt_layer_specs.py:643-671``)."""
    n = args.num_layers
    if args.num_experts is None:
        return (False,) * n
    freq = args.moe_layer_freq
    if isinstance(freq, int):
        return tuple(i % freq == 0 for i in range(n))
    return tuple(bool(v) for v in freq)


def megatron_stack(args: MegatronArgs) -> MegatronStack:
    """The layers ``args`` build (assumed valid: ``check_megatron_args``)."""
    shared = args.mtp_use_repeated_layer
    pattern = hybrid_pattern(args)
    if pattern is not None:
        mixers, mlps = pattern.layers(pattern.main)
        mtp_mixers, mtp_mlps = pattern.layers(pattern.mtp)
        return MegatronStack(mixers, mlps, mtp_mixers, mtp_mlps, pattern.depths, shared)
    attention: MixerKind = "attention"
    kinds: tuple[MlpKind, ...] = tuple("moe" if m else "dense" for m in moe_layers(args))
    depths = args.mtp_num_layers or 0
    if not depths:
        return MegatronStack((attention,) * args.num_layers, kinds)
    return MegatronStack(
        (attention,) * args.num_layers, kinds, (attention,), (kinds[-1],), depths, shared
    )


def mamba_heads(args: MegatronArgs) -> int:
    """Mamba-2's heads: ``--mamba-num-heads``, else ``2H / --mamba-head-dim``."""
    if args.mamba_num_heads is not None:
        return args.mamba_num_heads
    return MAMBA_EXPAND * args.hidden_size // args.mamba_head_dim


def kind_shapes(args: MegatronArgs, stack: MegatronStack) -> dict[str, Any]:
    """The geometry's fields for the kinds in ``stack`` other than attention's and the
    MLPs' (Mamba-2, Gated DeltaNet) and for latent attention."""
    kinds = set(stack.mixers) | set(stack.mtp_mixers)
    out: dict[str, Any] = {}
    if "mamba" in kinds:
        out.update(
            mamba_heads=mamba_heads(args),
            mamba_head_dim=args.mamba_head_dim,
            mamba_state_dim=args.mamba_state_dim,
            mamba_groups=args.mamba_num_groups,
            mamba_conv_kernel=MAMBA_CONV_KERNEL,
            mamba_chunk=MAMBA_CHUNK,
        )
    if "gdn" in kinds:
        out.update(
            gdn_key_heads=args.linear_num_key_heads,
            gdn_key_dim=args.linear_key_head_dim,
            gdn_value_heads=args.linear_num_value_heads,
            gdn_value_dim=args.linear_value_head_dim,
            gdn_conv_kernel=args.linear_conv_kernel_dim,
        )
    if latent(args):
        out.update(
            q_lora_rank=args.q_lora_rank or 0,
            kv_lora_rank=args.kv_lora_rank,
            qk_nope_head_dim=args.qk_head_dim,
            qk_rope_head_dim=args.qk_pos_emb_head_dim,
            v_head_dim=args.v_head_dim,
        )
    return out


def latent(args: MegatronArgs) -> bool:
    """Whether the run's attention is latent: ``--multi-latent-attention``, or a ``+`` in
    the hybrid pattern (arguments.py:919-923)."""
    pattern = args.hybrid_layer_pattern or args.hybrid_override_pattern or ""
    return args.multi_latent_attention or "+" in pattern
