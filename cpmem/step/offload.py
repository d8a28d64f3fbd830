"""Activation offloading as megatron-core runs it, in one of its two forms (``Offload``):

- fine-grained (``--fine-grained-activation-offloading --offload-modules ...``): which
  modules' saved tensors are copied to pinned host memory after their forward, and the
  smallest tensor that is;
- whole layers (``--cpu-offloading-num-layers N``, the legacy form): every saved tensor
  of at least ``TE_MIN_OFFLOADED_ELEMENTS`` elements of the transformer block's first
  ``N`` layers, through Transformer Engine's ``get_cpu_offload_context``.

What either keeps off the device is priced by ``cpmem.pricing.offload`` (and
``cpmem.pricing.layer_offload`` for whole layers); pinned host memory is not device
memory and is not priced.

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


TE_MIN_OFFLOADED_ELEMENTS = 256 * 1024
"""Transformer Engine's whole-layer offloading (b9d690e0,
``transformer_engine/pytorch/cpu_offload.py`` ``OffloadableLayerState._check_if_offload``):
a saved tensor with fewer elements stays on the device, as do parameters and the
tensors TE marks ``mark_not_offload`` (a linear's weights and biases)."""


@dataclass(frozen=True)
class Offload:
    """The modules whose saved tensors megatron-core offloads (empty: none), the
    smallest tensor it offloads, in elements, and under whole-layer offloading the number
    of the transformer block's first layers offloaded (0: none; then no module is
    named)."""

    modules: tuple[str, ...] = ()
    min_elements: int = MIN_OFFLOADED_ELEMENTS
    layers: int = 0

    def __post_init__(self) -> None:
        require_nonnegative_int("offload_min_elements", self.min_elements)
        require_nonnegative_int("offload_layers", self.layers)
        if self.layers and self.modules:
            raise InputError(
                "offload",
                f"layers:{self.layers}+{'+'.join(self.modules)}",
                "whole-layer and fine-grained offloading are one or the other "
                "(megatron-core: 'fine_grained_activation_offloading cannot be enabled "
                "with cpu_offloading', transformer_config.py:1743-1746)",
            )
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
    def whole_layers(cls, layers: int) -> Offload:
        """Whole-layer offloading of the block's first ``layers`` layers (0: none)."""
        return cls((), TE_MIN_OFFLOADED_ELEMENTS, layers) if layers else cls()

    @classmethod
    def parse(cls, value: Offload | str | Sequence[str] | None) -> Offload:
        """An ``Offload`` from itself, a '+'-joined text or a sequence of names (None or
        empty: none), each name once in the order given; ``layers:N`` (alone) is
        whole-layer offloading of the first N layers."""
        if value is None or isinstance(value, Offload):
            return value or cls()
        names = value.split("+") if isinstance(value, str) else list(value)
        words = tuple(dict.fromkeys(n.strip() for n in names if n.strip()))
        counts = [w for w in words if w.startswith("layers:")]
        if not counts:
            return cls(words)
        count = counts[0].partition(":")[2]
        if len(words) > 1 or not count.isdigit():
            raise InputError(
                "offload",
                "+".join(words),
                "whole-layer offloading is 'layers:N' alone, N the number of the "
                "transformer block's first layers offloaded",
            )
        return cls.whole_layers(int(count))

    @property
    def active(self) -> bool:
        return bool(self.modules) or self.layers > 0

    @property
    def words(self) -> list[str]:
        """The setting as ``parse`` reads it back: the modules, or ``layers:N`` alone."""
        return [f"layers:{self.layers}"] if self.layers else list(self.modules)

    def offloads(self, module: str) -> bool:
        return module in self.modules

    def layer_problems(
        self, model_layers: int, *, pipeline: bool, recompute: str | None, fp8: bool
    ) -> list[InputError]:
        """Whole-layer offloading's limits on a step of ``model_layers`` layers, with
        pipeline stages or not, the recompute it runs (None: none) and FP8 or not:
        megatron-core's (transformer_config.py:1602-1617: fewer layers than the model's,
        no pipeline stages, no recompute) and FP8's, whose saved copies a layer would
        send are not priced. None without it."""
        n = self.layers
        if not n:
            return []
        value = f"layers:{n}"
        reasons = []
        if n >= model_layers:
            reasons.append(
                f"megatron-core offloads fewer layers than the model's {model_layers} "
                "(transformer_config.py:1602-1607)"
            )
        if pipeline:
            reasons.append(
                "megatron-core: 'Currently there is no support for Pipeline parallelism with "
                "CPU offloading' (transformer_config.py:1609-1612)"
            )
        if recompute is not None:
            reasons.append(
                "megatron-core: 'CPU offloading does not work when activation recomputation "
                f"is enabled' (transformer_config.py:1614-1617); the step recomputes "
                f"{recompute} (give recompute none)"
            )
        if fp8:
            reasons.append(
                "not priced under FP8: the FP8 copies of the saved inputs a layer sends to "
                "the host are not named"
            )
        return [InputError("offload", value, r) for r in reasons]
