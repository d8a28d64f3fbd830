"""The weight matrices of each kind's sub-layer as a Hugging Face checkpoint stores them,
which a quantized checkpoint may hold quantized (``cpmem.pricing.quantized``): each
``[rows, cols]`` (outputs x inputs) apart, as the checkpoint names them, since a block
scale never spans two of them.

Their elements are the sub-layer's weights in its ``parameters`` (a test holds it): only
biases, norms, the router and gpt-oss's sinks are left out, which no format converts.
"""

from __future__ import annotations

from cpmem.model.geometry import ModelGeometry
from cpmem.pricing.layer_parameters import Linear, Placement


def attention_linears(g: ModelGeometry) -> tuple[Linear, ...]:
    """``q_proj`` (twice as wide with Qwen3.5's output gate), ``k_proj``, ``v_proj``
    (column-parallel) and ``o_proj`` (row-parallel); under latent attention (DeepSeek-V3's
    ``DeepseekV3Attention``) ``q_a_proj`` and ``kv_a_proj_with_mqa`` replicated over TP,
    ``q_b_proj`` (or a plain ``q_proj`` without ``q_lora_rank``) and ``kv_b_proj``
    column-parallel, ``o_proj`` row-parallel."""
    h, heads = g.hidden, g.q_heads
    out = Linear("attention", h, g.attention_output_width, "sharded", "cols")
    if not g.is_mla:
        q_rows = g.q_width * (2 if g.attention_output_gate else 1)
        kv = Linear("attention", g.kv_width, h, "sharded")
        return (Linear("attention", q_rows, h, "sharded"), kv, kv, out)
    q_up = Linear("attention", heads * g.head_dim, g.q_lora_rank or h, "sharded")
    q_down = (Linear("attention", g.q_lora_rank, h, "replicated"),) if g.q_lora_rank else ()
    return (
        *q_down,
        q_up,
        Linear("attention", g.kv_lora_rank + g.qk_rope_head_dim, h, "replicated"),
        Linear("attention", heads * (g.qk_nope_head_dim + g.v_head_dim), g.kv_lora_rank, "sharded"),
        out,
    )


def mlp_linears(g: ModelGeometry, ffn: int, role: str, count: int = 0) -> tuple[Linear, ...]:
    """An MLP of ``ffn``: ``gate_proj`` and ``up_proj`` (only ``up_proj`` where the MLP is
    not gated) column-parallel, ``down_proj`` row-parallel; ``count`` routed experts of it
    (placed over EP, split over ETP) where ``count`` is given."""
    h = g.hidden
    placement: Placement = "experts" if count else "sharded"
    n = count or 1
    up = Linear(role, ffn, h, placement, "rows", n)
    down = Linear(role, h, ffn, placement, "cols", n)
    return (up, up, down) if g.gated_mlp else (up, down)


def moe_linears(g: ModelGeometry) -> tuple[Linear, ...]:
    """The shared expert's MLP (sharded over TP) and every routed expert's (over EP)."""
    shared = mlp_linears(g, g.shared_expert_ffn, "shared_expert") if g.shared_expert_ffn else ()
    return (*shared, *mlp_linears(g, g.expert_ffn, "experts", g.num_experts))
