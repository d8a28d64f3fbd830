"""What megatron-core's whole-layer activation offloading (``--cpu-offloading-num-layers
N``, the step's ``Offload.layers``) keeps off the device at the moments ``tight``'s
figure prices: the bytes taken off the retained set (``offloaded_retained_bytes``).
Pinned host memory is not device memory: what is offloaded is priced nowhere.

Sources. Megatron-LM 4828d651: ``TransformerBlock`` wraps each of its layers' forward in
Transformer Engine's offload context and hands its output to the context's
synchronisation function (transformer_block.py:298-319, 663-685), with
``model_layers = num_layers``; the MTP layers run outside it
(multi_token_prediction.py:1054) and so does a hybrid model's ``MambaStack``
(ssm/mamba_block.py opens no offload context): a stack with a Mamba layer offloads
nothing. Transformer Engine b9d690e0, ``pytorch/cpu_offload.py`` (the default path,
``NVTE_CPU_OFFLOAD_V1`` unset): ``DefaultOffloadSynchronizer`` offloads layers
``0 .. N-1``; layer ``i``'s copy to the host starts when layer ``i + 1``'s forward begins,
and its device tensors are freed when layer ``L - N + i``'s forward begins
(``finish_offload_map``); in backward its reload is allocated on the device when layer
``L - 1 - N + i``'s backward begins (``start_reload_map``) and freed after its own
backward (``release_all_memory``). Every tensor autograd saves inside the context is
offloaded but a parameter, a tensor TE marks ``mark_not_offload`` (weights and biases),
a non-contiguous one, and one of fewer than ``TE_MIN_OFFLOADED_ELEMENTS`` elements
(``_check_if_offload``).

So with ``a_i`` what layer ``i`` offloads, the device holds at layer ``j``'s forward, and
again at its backward (the two schedules mirror each other), the offloadable tensors of
layers ``0 .. j`` less those of the layers ``i <= min(N - 1, j - L + N)``: with equal
layers never more than ``L - N`` layers' worth (TE's docstring: activation memory
``(num_layers - num_offloaded_layers) * T``).

What is priced as offloaded: the tensors ``cpmem.pricing.offload.module_sends`` names
in a layer's saved set (the attention's output projection input, a norm's input where
the norm is a module of its own but the first layer's input norm's, the experts' fc1 and
activation inputs) at TE's
smallest size; every other tensor a layer offloads is priced on the device (a bound).
The figure's moments assume every layer's kept set present (the end of forward, the
head, the last layer's backward) or the kept sets of layers ``0 .. j`` at a kind's last
layer ``j``; the bytes taken off are the fewest off the device at any of them, and never
more than what is off the device at every moment of the step, whatever its layers'
sizes.
"""

from __future__ import annotations

from cpmem.pricing.components import OUTSIDE_FIGURE
from cpmem.pricing.offload import module_sends
from cpmem.step.step import Step

PRICED_MODULES = ("attn_norm", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")
"""The named tensors counted as offloaded (``module_sends``): not ``core_attn``'s
unfused scores, which the step prices in their own component, on the device."""


def layer_sizes(step: Step, tokens: int) -> list[int]:
    """Per layer of the step's transformer block, the bytes of the named tensors it
    offloads if it is offloaded, on the rank holding ``tokens`` model tokens. The first
    layer's input norm's input is the block's input, which ``GPTModel.forward`` holds
    (``decoder_input``) through the head: on the device whatever its copy."""
    sizes = []
    for layer, sends in enumerate(module_sends(step, tokens)):
        named = [m for m in PRICED_MODULES if not (layer == 0 and m == "attn_norm")]
        sizes.append(sum(v for m, v in sends.items() if m in named))
    return sizes


def offloaded_at(sizes: list[int], offloaded: int, layer: int) -> int:
    """Bytes of the named tensors off the device while layer ``layer`` runs its forward
    or its backward, the first ``offloaded`` of the ``len(sizes)`` layers offloaded."""
    last_off = min(offloaded - 1, layer - len(sizes) + offloaded)
    return sum(sizes[: last_off + 1]) if last_off >= 0 else 0


def on_device_at(sizes: list[int], offloaded: int, layer: int) -> int:
    """Bytes of the named tensors of layers ``0 .. layer`` on the device while layer
    ``layer`` runs its forward or its backward."""
    return sum(sizes[: layer + 1]) - offloaded_at(sizes, offloaded, layer)


def offloaded_retained_bytes(step: Step, tokens: int) -> int:
    """Bytes the retained set holds off the device at every moment ``tight``'s figure
    prices, on the rank holding ``tokens`` model tokens: 0 without whole-layer
    offloading, without saved sets, or in a stack whose layers TE does not see."""
    n = step.settings.offload.layers
    g = step.geometry
    if not n or not step.recompute.keeps_saved_sets or "mamba" in g.mixers:
        return 0
    # the figure's moments: the end of forward and each kind's last layer
    moments = {g.layers - 1}
    for stack in (g.mixers, g.mlps):
        moments |= {i for i, kind in enumerate(stack) if kind not in stack[i + 1 :]}
    return taken_off(layer_sizes(step, tokens), n, moments)


def taken_off(sizes: list[int], offloaded: int, moments: set[int]) -> int:
    """What may come off a figure that prices every layer's ``sizes`` at each moment, the
    first ``offloaded`` layers offloaded: the fewest bytes off the device at any layer's
    forward or backward (every layer's less the most ever on the device), and at each of
    the figure's ``moments`` (layers where it prices only the layers up to them) what is
    off the device there."""
    anywhere = sum(sizes) - max(on_device_at(sizes, offloaded, j) for j in range(len(sizes)))
    return min(anywhere, *(offloaded_at(sizes, offloaded, j) for j in moments))


def layer_offload_notes(step: Step) -> tuple[str, ...]:
    """The answer's line on whole-layer offloading, where the step offloads."""
    n = step.settings.offload.layers
    if not n:
        return ()
    if "mamba" in step.geometry.mixers:
        return (
            f"offload=layers:{n}: a hybrid model's Mamba stack opens no offload context: "
            "nothing is offloaded",
        )
    return (
        f"offload=layers:{n}: the saved tensors of at least {step.settings.offload.min_elements} "
        f"elements of the first {n} layers go to pinned host memory, at most "
        f"{step.geometry.layers - n} layers' on the device at once (Transformer Engine's "
        "default synchronizer); the output projection's input, a norm's input and the "
        "experts' inputs are priced off the device, every other tensor on it. "
        "Pinned host memory is not device memory: " + OUTSIDE_FIGURE,
    )
