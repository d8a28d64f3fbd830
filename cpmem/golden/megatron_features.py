"""The feature families a Megatron-LM recording exercises, read from its case's arguments.

Each recording of ``golden/megatron/recordings.csv`` carries the features its case's
``model_config.yaml`` turns on (``features``, ``;``-separated in ``FEATURES`` order): the
kinds of training the recordings measure beyond the GPT and MoE runs cpmem prices, so
the gate's tier and its report can group the recordings by what they exercise. A feature
is a rule over the case's ``MODEL_ARGS`` (and ``TEST_TYPE``), never a tag typed per case:

- ``hybrid``: a hybrid layer stack (``--hybrid-layer-pattern``, ``--hybrid-override-pattern``
  or ``--is-hybrid-model``: Mamba-2 mixers beside attention, MLP and MoE layers);
- ``mla``: multi-latent attention (``--multi-latent-attention``);
- ``mtp``: multi-token prediction layers (``--mtp-num-layers`` above 0);
- ``fp8``: FP8 training (``--fp8-format``, ``--fp8-recipe`` or ``--fp8-param-gather``);
- ``fsdp``: Megatron FSDP or Torch FSDP2 (``--use-megatron-fsdp``, ``--use-torch-fsdp2``);
- ``muon``: the Muon optimizer (``--optimizer muon`` or ``dist_muon``);
- ``offloading``: activations offloaded to the host (``--fine-grained-activation-offloading``,
  ``--offload-modules``, ``--cpu-offloading``);
- ``cudagraph``: CUDA graphs (``--cuda-graph-impl`` other than ``none``,
  ``--enable-cuda-graph``, ``--external-cuda-graph``, ``--cuda-graph-scope``);
- ``release-15b``: a release run (``TEST_TYPE: release``; the snapshot's release runs are
  the 15B ones, ``gpt3_15b_8t_release`` and ``_sm``).

A flag counts where the case gives it with a value that turns it on: a switch as ``true``
or with no value, any other value except ``false``, ``0`` and ``none``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

FEATURE_SEPARATOR = ";"


def _on(value: object) -> bool:
    """Whether a ``MODEL_ARGS`` value turns its flag on (``None`` is a bare switch)."""
    if value is None or value is True:
        return True
    if value is False:
        return False
    if isinstance(value, int | float) and value == 0:
        return False
    return str(value).strip().lower() not in ("", "false", "none", "0")


def _any(*flags: str) -> Callable[[Mapping[str, object], str], bool]:
    def given(args: Mapping[str, object], test_type: str) -> bool:
        return any(flag in args and _on(args[flag]) for flag in flags)

    return given


def _muon(args: Mapping[str, object], test_type: str) -> bool:
    return str(args.get("--optimizer", "")).strip() in ("muon", "dist_muon")


def _release(args: Mapping[str, object], test_type: str) -> bool:
    return test_type == "release"


@dataclass(frozen=True)
class Feature:
    """One feature family: its tag, what it is, and the rule that finds it."""

    tag: str
    what: str
    applies: Callable[[Mapping[str, object], str], bool]


FEATURES: tuple[Feature, ...] = (
    Feature(
        "hybrid",
        "hybrid layer stack (Mamba-2 mixers beside attention, MLP and MoE layers)",
        _any("--hybrid-layer-pattern", "--hybrid-override-pattern", "--is-hybrid-model"),
    ),
    Feature("mla", "multi-latent attention", _any("--multi-latent-attention")),
    Feature("mtp", "multi-token prediction layers", _any("--mtp-num-layers")),
    Feature("fp8", "FP8 training", _any("--fp8-format", "--fp8-recipe", "--fp8-param-gather")),
    Feature(
        "fsdp", "Megatron FSDP or Torch FSDP2", _any("--use-megatron-fsdp", "--use-torch-fsdp2")
    ),
    Feature("muon", "the Muon optimizer", _muon),
    Feature(
        "offloading",
        "activations offloaded to the host",
        _any("--fine-grained-activation-offloading", "--offload-modules", "--cpu-offloading"),
    ),
    Feature(
        "cudagraph",
        "CUDA graphs",
        _any(
            "--cuda-graph-impl",
            "--enable-cuda-graph",
            "--external-cuda-graph",
            "--cuda-graph-scope",
        ),
    ),
    Feature("release-15b", "the 15B release runs (TEST_TYPE release)", _release),
)
FEATURE_TAGS: tuple[str, ...] = tuple(f.tag for f in FEATURES)


def case_features(model_args: Mapping[str, object], test_type: str) -> tuple[str, ...]:
    """The feature tags a case's ``MODEL_ARGS`` and ``TEST_TYPE`` turn on, in ``FEATURES``
    order (empty: none of them)."""
    args = {str(k).strip(): v for k, v in model_args.items()}
    return tuple(f.tag for f in FEATURES if f.applies(args, test_type))


def format_features(tags: tuple[str, ...]) -> str:
    return FEATURE_SEPARATOR.join(tags)


def parse_features(text: str) -> tuple[str, ...]:
    """A ``features`` cell as its tags (unknown tags kept: ``check_recordings`` names them)."""
    return tuple(t for t in text.split(FEATURE_SEPARATOR) if t)
