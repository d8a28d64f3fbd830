"""Fine-grained activation offloading as megatron-core runs it
(``--fine-grained-activation-offloading --offload-modules ...``): which modules' saved
tensors are copied to pinned host memory after their forward, and the smallest tensor
that is (``Offload``). What that keeps off the device is priced by
``cpmem.pricing.offload``; pinned host memory is not device memory and is not priced.

Sources at the recordings' snapshot (Megatron-LM 4828d651,
``megatron/core/transformer/transformer_config.py``): the modules (1167-1178), the
smallest offloaded tensor, ``1024 * 1024`` elements (1180), the allowed names (1748-1757)
and ``attn_proj`` needing ``core_attn`` (1763-1768, the projection's input is the core's
output, which the core's backward needs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cpmem.errors import InputError, refuse_all, require_nonnegative_int

OFFLOAD_MODULES = (
    "attn_norm",
    "qkv_linear",
    "core_attn",
    "attn_proj",
    "mlp_norm",
    "expert_fc1",
    "moe_act",
    "fused_group_mlp",
)
"""megatron-core's ``allowed_modules`` (transformer_config.py:1748-1757), in the order a
transformer layer's forward commits their groups (transformer_layer.py, attention.py,
multi_latent_attention.py, moe/experts.py) but ``attn_norm`` and ``mlp_norm``, which
commit after their sub-layer's residual add (transformer_layer.py:689-693, 930-936)."""

MIN_OFFLOADED_ELEMENTS = 1024 * 1024
"""transformer_config.py:1180 ``min_offloaded_tensor_size``: a saved tensor with fewer
elements stays on the device (fine_grained_activation_offload.py:993-994,
``tensor_need_offloading_checker``)."""


@dataclass(frozen=True)
class Offload:
    """The modules whose saved tensors megatron-core offloads (empty: none) and the
    smallest tensor it offloads, in elements."""

    modules: tuple[str, ...] = ()
    min_elements: int = MIN_OFFLOADED_ELEMENTS

    def __post_init__(self) -> None:
        require_nonnegative_int("offload_min_elements", self.min_elements)
        problems = [
            InputError(
                "offload",
                name,
                f"is not a module megatron-core offloads; allowed: {', '.join(OFFLOAD_MODULES)} "
                "(transformer_config.py:1748-1761)",
            )
            for name in self.modules
            if name not in OFFLOAD_MODULES
        ]
        if "attn_proj" in self.modules and "core_attn" not in self.modules:
            problems.append(
                InputError(
                    "offload",
                    "attn_proj",
                    "needs core_attn: the projection's input is the core attention's output, "
                    "which the core's backward needs (transformer_config.py:1763-1768)",
                )
            )
        refuse_all(problems)

    @classmethod
    def parse(cls, value: Offload | str | Sequence[str] | None) -> Offload:
        """An ``Offload`` from itself, a '+'-joined text or a sequence of names (None or
        empty: none), each name once in the order given."""
        if value is None or isinstance(value, Offload):
            return value or cls()
        names = value.split("+") if isinstance(value, str) else list(value)
        return cls(tuple(dict.fromkeys(n.strip() for n in names if n.strip())))

    @property
    def active(self) -> bool:
        return bool(self.modules)

    def offloads(self, module: str) -> bool:
        return module in self.modules
