"""CUDA graphs of the training step's layers, as megatron-core captures them through
Transformer Engine's ``make_graphed_callables`` (Megatron-LM's ``--cuda-graph-impl
transformer_engine``): the step setting ``cuda_graphs`` (``transformer_engine[:MODULES]``,
the modules comma-separated; none given: every layer whole).

Sources: Megatron-LM d98e8a64 (the snapshot), ``megatron/core/transformer/cuda_graphs.py``
(``TECudaGraphHelper``, ``_layer_is_graphable``), ``transformer_layer.py``
(``get_layer_static_inputs``, ``_te_cuda_graph_capture``) and ``transformer_config.py``
(the modules' rules, 2792-2895); Transformer Engine b9d690e0 ``pytorch/graph.py``.

What a graph keeps and where it is priced: ``cpmem.pricing.cuda_graphs``. The other
implementations are refused with their reason (``IMPL_REASONS``): megatron-core's own
``CudaGraphManager`` (``local``) keeps a memory pool per micro-batch and its own buffers,
``full_iteration`` captures the whole step.
"""

from __future__ import annotations

from dataclasses import dataclass

from cpmem.errors import InputError

PRICED_IMPL = "transformer_engine"
MODULES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")
"""Megatron-LM's ``--cuda-graph-modules`` (``CudaGraphModule``, transformer_config.py:1093)."""
IMPL_REASONS = {
    "local": "megatron-core's CudaGraphManager (--cuda-graph-impl local, --enable-cuda-graph) "
    "keeps its own static buffers and a memory pool per micro-batch (cuda_graphs.py:"
    "1958-2020), not priced",
    "full_iteration": "the whole iteration captured as one graph (full_cuda_graph.py) keeps "
    "its static batch and the step's activations in the graph's pool, not priced",
}
"""Why each implementation cpmem does not price is refused."""


@dataclass(frozen=True)
class CudaGraphs:
    """Per-layer CUDA graphs: the ``impl`` that captures them and the ``modules`` of each
    layer captured (empty: the whole layer)."""

    impl: str = PRICED_IMPL
    modules: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return self.impl + (":" + ",".join(self.modules) if self.modules else "")

    def names(self, module: str) -> bool:
        """Whether ``module`` is named among the modules."""
        return module in self.modules

    def captures(self, module: str) -> bool:
        """Whether ``module``'s scope is captured (all of them when none is named)."""
        return not self.modules or self.names(module)

    @classmethod
    def parse(cls, value: str | CudaGraphs | None) -> CudaGraphs | None:
        """``IMPL[:MODULE,MODULE...]``; None, ``""`` and ``none``: no graphs."""
        if value is None or isinstance(value, CudaGraphs):
            return value
        usage = f"must be IMPL[:MODULES] (IMPL {PRICED_IMPL}; MODULES among {list(MODULES)})"
        if not isinstance(value, str):
            raise InputError("cuda_graphs", value, usage)
        text = value.strip().lower()
        if text in ("", "none"):
            return None
        impl, _, rest = text.partition(":")
        modules = tuple(m.strip() for m in rest.replace("+", ",").split(",") if m.strip())
        unknown = [m for m in modules if m not in MODULES]
        if unknown or len(set(modules)) != len(modules):
            raise InputError("cuda_graphs", value, usage)
        return cls(impl, modules)


def graphs_label(graphs: CudaGraphs | None) -> str | None:
    """The setting as given back (None: no graphs)."""
    return None if graphs is None else graphs.label


def cuda_graph_problems(
    graphs: CudaGraphs,
    *,
    moe: bool,
    dense_mlp: bool,
    gdn: bool = False,
    mtp_shared: bool = False,
    overlap_moe_comm: bool = False,
) -> list[str]:
    """Why ``graphs`` is not priced on a model (``moe``: it has routed-expert layers;
    ``dense_mlp``: dense MLP layers; ``gdn``: Gated DeltaNet mixers; ``mtp_shared``: one
    MTP layer run at every depth) under the EP overlap's schedule or not, every reason;
    Megatron-LM's own rules are cited (transformer_config.py at the snapshot)."""
    out: list[str] = []
    if gdn:
        out.append("Gated DeltaNet layers' graphs are not priced")
    if mtp_shared:
        out.append("a repeated MTP layer's graphs are not priced")
    if overlap_moe_comm:
        out.append(
            "graphs under the EP overlap's schedule (its own capture order, "
            "cuda_graphs.py:2628-2654) are not priced"
        )
    if graphs.impl in IMPL_REASONS:
        out.append(f"{graphs.impl}: {IMPL_REASONS[graphs.impl]}")
    elif graphs.impl != PRICED_IMPL:
        out.append(f"impl {graphs.impl!r} is not one of {[PRICED_IMPL, *IMPL_REASONS]}")
    mods = graphs.modules
    if "moe" in mods and "moe_router" in mods:
        out.append("cuda_graph_modules must not contain both moe and moe_router (2817-2820)")
    if "moe_preprocess" in mods and "moe_router" not in mods:
        out.append("moe_preprocess cuda graph is only supported with moe_router (2821-2824)")
    if not moe and ("moe" in mods or "moe_router" in mods):
        out.append("moe cuda graph is only supported for MoE (2825-2829)")
    if moe and not dense_mlp and "mlp" in mods:
        out.append("mlp cuda graph is only supported for dense layers (2831-2836)")
    if moe and (not mods or "moe" in mods):
        out.append(
            "the whole MoE layer captured (no modules, or moe) runs only with drop-and-pad "
            "experts (2837-2844), not priced"
        )
    return out


def check_cuda_graphs(graphs: CudaGraphs | None, **facts: bool) -> None:
    """Refuse ``graphs`` with every reason ``cuda_graph_problems`` gives."""
    if graphs is None:
        return
    problems = cuda_graph_problems(graphs, **facts)
    if problems:
        raise InputError("cuda_graphs", graphs.label, "; ".join(problems))
