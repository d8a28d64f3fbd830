"""The megatron engine: megatron-core's GPTModel with the local layer spec and LoRA.

Why: attention-only cells are measured on the layers the golden sources measured
(megatron-core, no Transformer Engine), at any TP with or without SP; CP = 1 only.
On CPU it runs through the saved-tensor oracle's shim, for this driver's tests only.
"""

from __future__ import annotations

import sys
from typing import Any

from cpmem.model.geometry import ModelGeometry

from .paths import REPO_ROOT
from .spec import CellSpec
from .torchlib import load_torch


def _oracle_module() -> Any:
    """``oracles.megatron_layer``: the megatron CPU shim and layer settings live there."""
    if str(REPO_ROOT) not in sys.path:  # e.g. imported from outside the checkout
        sys.path.insert(0, str(REPO_ROOT))
    import oracles.megatron_layer

    return oracles.megatron_layer


def install_megatron_cpu_shim() -> None:
    """Let megatron-core 0.16 build and run on CPU, for this driver's CPU tests only
    (never used when CUDA is present): the saved-tensor oracle's shim, reused."""
    _oracle_module().install_megatron_cpu_shim()


def _megatron_lora(linear: Any, sp: bool, rank: int = 1, dropout: float = 0.0) -> None:
    """Freeze a megatron parallel linear and add a rank-``rank`` adapter that follows its
    sharding (the harness: rank 1, no dropout), with torch's dropout on the adapter's
    input before A (PEFT's order) when ``dropout`` > 0.

    Column-parallel: A replicated, B sharded on outputs; the rank-1 activation is gathered
    over the sequence under SP. Row-parallel: A sharded on inputs, its rank-1 partial sums
    reduced (scattered over the sequence under SP), B replicated. Replicated adapter grads
    are not synchronised across TP (no optimizer step is taken).
    """
    torch = load_torch()
    from megatron.core.tensor_parallel import mappings
    from megatron.core.tensor_parallel.layers import RowParallelLinear

    weight = linear.weight
    n_out, n_in = weight.shape
    dev, dt = weight.device, weight.dtype
    linear.lora_a = torch.nn.Parameter(torch.randn(rank, n_in, device=dev, dtype=dt) * 0.02)
    linear.lora_b = torch.nn.Parameter(torch.randn(n_out, rank, device=dev, dtype=dt) * 0.02)
    row = isinstance(linear, RowParallelLinear)
    base = linear.forward
    f = torch.nn.functional

    def forward(x: Any, *args: Any, **kwargs: Any) -> Any:
        out, bias = base(x, *args, **kwargs)
        mid = f.linear(f.dropout(x, dropout, training=True) if dropout else x, linear.lora_a)
        if row:
            mid = (
                mappings.reduce_scatter_to_sequence_parallel_region(mid)
                if sp
                else mappings.reduce_from_tensor_model_parallel_region(mid)
            )
        elif sp:
            mid = mappings.gather_from_sequence_parallel_region(mid)
        else:
            mid = mappings.copy_to_tensor_model_parallel_region(mid)
        return out + f.linear(mid, linear.lora_b), bias

    linear.forward = forward


def build_megatron_model(spec: CellSpec, geometry: ModelGeometry, device: Any, seq: int) -> Any:
    """GPTModel (local spec, pre_process on, post_process off: it returns hidden states;
    a trainer cell's head is head.py's, on top)."""
    torch = load_torch()
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.transformer_config import TransformerConfig

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(spec.tp, 1)
    on_cpu = device.type == "cpu"
    if not on_cpu:
        tensor_parallel.model_parallel_cuda_manual_seed(spec.seed)
    recompute: dict[str, Any] = {"recompute_granularity": None}
    if spec.recompute == "selective":
        recompute = {
            "recompute_granularity": "selective",
            "recompute_modules": spec.modules.split("+"),
        }
    elif spec.recompute == "full":
        recompute = {
            "recompute_granularity": "full",
            "recompute_method": "uniform",
            "recompute_num_layers": 1,
        }
    config = TransformerConfig(
        num_layers=geometry.layers,
        hidden_size=geometry.hidden,
        ffn_hidden_size=geometry.ffn,
        num_attention_heads=geometry.q_heads,
        num_query_groups=geometry.kv_groups,
        kv_channels=geometry.head_dim,
        attention_output_gate=geometry.attention_output_gate,
        tensor_model_parallel_size=spec.tp,
        sequence_parallel=spec.sp and spec.tp > 1,
        use_cpu_initialization=on_cpu,
        **_oracle_module().megatron_layer_settings(),
        **recompute,
    )
    layer_spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    model = GPTModel(
        config=config,
        transformer_layer_spec=layer_spec,
        vocab_size=geometry.vocab,
        max_sequence_length=max(seq, 1) * 2,
        pre_process=True,
        post_process=False,
        position_embedding_type="rope",
        rotary_base=1_000_000,
    ).to(device=device, dtype=torch.bfloat16)
    for p in model.parameters():
        p.requires_grad_(False)
    for m in list(model.modules()):
        if isinstance(m, ColumnParallelLinear | RowParallelLinear):
            _megatron_lora(m, spec.sp and spec.tp > 1, spec.lora_rank, spec.lora_dropout)
    if spec.recompute == "full":
        # megatron's full recompute is reentrant: its input must require grad
        model.embedding.register_forward_hook(lambda _m, _a, out: out.detach().requires_grad_(True))
    model.train()
    return model
