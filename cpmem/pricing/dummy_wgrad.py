"""The output layer's cached dummy weight gradient: a persistent ``[V/t, h]`` tensor on
the stage holding a trained output layer, where gradient-accumulation fusion is on.

With fusion, megatron-core's output layer (``ColumnParallelLinear``'s
``LinearWithGradAccumulationAndAsyncCommunication.backward``, tensor_parallel/
layers.py:726-752 at the recordings' snapshot) accumulates the weight gradient into
``main_grad`` inside the GEMM and returns a dummy of the gradient's shape and the input's
dtype as the weight's ``.grad``, so that the DDP hook runs on the backward's thread. Where
Transformer Engine is installed it takes that dummy from TE's ``get_dummy_wgrad``, which
keeps one tensor per (shape, dtype) in a module-level dict for the process's lifetime
(``transformer_engine/pytorch/module/base.py``: ``_dummy_wgrads``); so it stays
allocated between steps. Without Transformer Engine (or with a TE before 2.3, which has
no ``get_dummy_wgrad``: the import fails and ``HAVE_TE`` is false) the dummy is a
``torch.empty`` freed with the step's gradients.

What this does not price: Transformer Engine's own layers take their dummies from the same
cache under fusion (``module/linear.py``, one per distinct weight shape on the stage, at
most one layer's linear weights); they are not priced.
"""

from __future__ import annotations

from cpmem.pricing.weights import padded_vocab
from cpmem.step.step import StepSettings

CONTAINERS_WITHOUT_CACHE = frozenset({"ngc-24.01"})
"""Named containers (``backend_choice.NAMED_CONTAINERS``) whose Transformer Engine has no
``get_dummy_wgrad``: NGC PyTorch 24.01 ships TE 1.x, and the cache arrived in TE 2.3
("Enable reuse of dummy wgrad tensor", TransformerEngine ba5dc5dde, 2025-04-08)."""


def dummy_wgrad_bytes(settings: StepSettings, stage: int) -> int:
    """The output layer's cached dummy gradient on pipeline ``stage``: ``[V/t, h]`` in the
    step's dtype where the stage holds a trained output layer (the last stage of a full
    run whose head is the output layer), gradients are accumulated in the fused GEMM and
    the layers are Transformer Engine's (read as TE installed, ``layers.py``'s
    ``HAVE_TE``) in a container whose TE caches it; else 0."""
    if settings.training != "full" or settings.head.returns_hidden:
        return 0
    if stage != settings.pipeline.pp - 1:
        return 0
    runtime = settings.runtime
    if not runtime.gradient_accumulation_fusion or runtime.transformer_impl != "transformer_engine":
        return 0
    if runtime.container in CONTAINERS_WITHOUT_CACHE:
        return 0
    g, tp = settings.geometry, settings.layout.tp
    return padded_vocab(g, tp) // tp * g.hidden * settings.dtype_bytes
