"""The saved-tensor oracle's megatron layer: megatron-core 0.16 built and run on CPU (the
shim, a single-process world, the layer settings every cpmem megatron layer shares) and
one ``TransformerBlock`` layer with rank-1 LoRA measured under each recompute mode
(``measure_megatron``), by ``oracles.saved_tensors``' counting. The rank simulator and the
native driver reuse the shim and the settings. Facts in oracles/README.md.

Nothing here imports cpmem.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from oracles.reference_layers import BF16, FusedRMSNorm
from oracles.saved_tensors import (
    SMALL_FRACTION,
    Measurement,
    OracleGeometry,
    _fake_mode,
    measure_forward,
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_SHIM_DONE = False


def install_megatron_cpu_shim() -> None:
    """Make megatron-core 0.16 build and run on CPU (facts in oracles/README.md).

    Idempotent and process-wide: torch.cuda helpers become CPU no-ops, causal masks
    are built on CPU, the RNG tracker's fork is a plain context, and the fp8 flag of
    CheckpointWithoutOutput is read as a boolean. Process groups are the caller's
    (see :func:`init_single_process_megatron`).
    """
    global _SHIM_DONE
    if _SHIM_DONE:
        return
    import megatron.core.fusions.fused_softmax as fsm
    import megatron.core.transformer.utils as tutils
    from megatron.core.tensor_parallel import random as mrandom

    cuda = torch.cuda
    cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()  # type: ignore[assignment]
    cuda.set_rng_state = lambda *a, **k: None  # type: ignore[assignment]
    cuda.manual_seed = lambda *a, **k: None  # type: ignore[assignment]
    cuda.empty_cache = lambda: None  # type: ignore[assignment]
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda *a, **k: None

    def causal_mask(sq: int) -> torch.Tensor:
        return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)

    tutils.get_default_causal_mask = causal_mask
    fsm.get_default_causal_mask = causal_mask

    @contextlib.contextmanager
    def fork(self: Any, name: str = "") -> Iterator[None]:
        yield

    mrandom.CudaRNGStatesTracker.fork = fork
    orig_init = mrandom.CheckpointWithoutOutput.__init__

    def cwo_init(self: Any, fp8: Any = False) -> None:
        orig_init(self, fp8)
        self.fp8 = bool(fp8)

    mrandom.CheckpointWithoutOutput.__init__ = cwo_init
    _SHIM_DONE = True


def init_single_process_megatron() -> None:
    """The CPU shim plus a world-size-1 gloo group with TP = PP = CP = 1."""
    from megatron.core import parallel_state

    install_megatron_cpu_shim()
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", world_size=1, rank=0
        )
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


def megatron_layer_settings() -> dict[str, Any]:
    """TransformerConfig settings every cpmem megatron layer shares (oracle and native
    driver): bf16 SwiGLU with RMSNorm and qk-norm, no bias, no dropout, and the fusions
    off that have no CPU path (facts in oracles/README.md)."""
    return {
        "gated_linear_unit": True,
        "activation_func": F.silu,
        "normalization": "RMSNorm",
        "qk_layernorm": True,
        "add_bias_linear": False,
        "bf16": True,
        "params_dtype": BF16,
        "pipeline_dtype": BF16,
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
        "bias_activation_fusion": False,
        "bias_dropout_fusion": False,
        "masked_softmax_fusion": False,
        "apply_rope_fusion": False,
        "gradient_accumulation_fusion": False,
        "persist_layer_norm": False,
    }


MEGATRON_MODES: dict[str, dict[str, Any]] = {
    "none": {"recompute_granularity": None},
    "selective-core_attn": {
        "recompute_granularity": "selective",
        "recompute_modules": ["core_attn"],
    },
    "selective-mlp": {"recompute_granularity": "selective", "recompute_modules": ["mlp"]},
    "selective-core_attn+mlp": {
        "recompute_granularity": "selective",
        "recompute_modules": ["core_attn", "mlp"],
    },
    "full": {
        "recompute_granularity": "full",
        "recompute_method": "uniform",
        "recompute_num_layers": 1,
    },
}


def _add_lora(linear: nn.Module) -> None:
    """Freeze a megatron linear and add a rank-1 adapter to its output."""
    weight = linear.weight
    n_out, n_in = weight.shape
    linear.lora_a = nn.Parameter(torch.randn(1, n_in, dtype=weight.dtype) * 0.02)
    linear.lora_b = nn.Parameter(torch.randn(n_out, 1, dtype=weight.dtype) * 0.02)
    base = linear.forward

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out, bias = base(x, *args, **kwargs)
        return out + F.linear(F.linear(x, linear.lora_a), linear.lora_b), bias

    linear.forward = forward


def build_megatron_block(geo: OracleGeometry, mode: str, fused_norm: bool = False) -> nn.Module:
    """A one-layer megatron TransformerBlock (local spec) with rank-1 LoRA, frozen base.

    ``fused_norm`` swaps the layer's torch RMSNorms for the fused-kernel contract
    (input + fp32 rstd saved): torch's CPU rms_norm instead saves an fp32 copy of its
    input, which no GPU kernel does.
    """
    init_single_process_megatron()
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.transformer_block import TransformerBlock
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=1,
        hidden_size=geo.hidden,
        ffn_hidden_size=geo.ffn,
        num_attention_heads=geo.q_heads,
        num_query_groups=geo.kv_groups,
        kv_channels=geo.head_dim,
        use_cpu_initialization=True,
        **megatron_layer_settings(),
        **MEGATRON_MODES[mode],
    )
    spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    block = TransformerBlock(config, spec, post_layer_norm=False)
    for p in block.parameters():
        p.requires_grad_(False)
    for m in list(block.modules()):
        if isinstance(m, ColumnParallelLinear | RowParallelLinear):
            _add_lora(m)
    if fused_norm:
        layer, attn = block.layers[0], block.layers[0].self_attention
        for owner, name, width in (
            (layer, "input_layernorm", geo.hidden),
            (layer, "pre_mlp_layernorm", geo.hidden),
            (attn, "q_layernorm", geo.head_dim),
            (attn, "k_layernorm", geo.head_dim),
        ):
            setattr(owner, name, FusedRMSNorm(width, config.layernorm_epsilon))
    block.train()
    return block


def measure_megatron(
    geo: OracleGeometry, mode: str, seq: int, *, fake: bool = True, fused_norm: bool = False
) -> Measurement:
    """Saved bytes of one megatron layer, labelled ``attention`` / ``mlp`` by sub-layer.

    Under full recompute the whole layer is one checkpoint; its saved inputs carry the
    label ``layer``.
    """
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    init_single_process_megatron()
    from megatron.core import parallel_state
    from megatron.core.utils import GlobalMemoryBuffer

    # The attention-score buffer is global and outlives a fake mode: start a fresh one.
    parallel_state._GLOBAL_MEMORY_BUFFER = GlobalMemoryBuffer()
    torch.manual_seed(0)
    with _fake_mode() if fake else contextlib.nullcontext():
        block = build_megatron_block(geo, mode, fused_norm)
        layer = block.layers[0]
        rope = RotaryEmbedding(
            kv_channels=geo.head_dim, rotary_percent=1.0, use_cpu_initialization=True
        )
        x = torch.randn(seq, 1, geo.hidden, dtype=BF16, requires_grad=True)

        def call(hidden: torch.Tensor) -> torch.Tensor:
            return block(hidden, attention_mask=None, rotary_pos_emb=rope(seq))

        labels = {layer.input_layernorm: "attention", layer.pre_mlp_layernorm: "mlp"}
        if mode == "full":
            labels = {}
        m = measure_forward(block, (x,), seq, labels=labels, call=call)
    m.small_width = geo.hidden // SMALL_FRACTION
    return m


__all__ = [
    "MEGATRON_MODES",
    "build_megatron_block",
    "init_single_process_megatron",
    "install_megatron_cpu_shim",
    "measure_megatron",
    "megatron_layer_settings",
]
