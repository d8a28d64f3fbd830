"""``--pipeline-model-parallel-layout``: the string that places the embedding (``E``), the
transformer layers (``t``), the MTP layers (``m``) and the loss (``L``) on the virtual
pipeline stages, ``|`` between stages, ``(...)*n`` and ``x*n`` repeating (``Et*3|(tt|)*6tmL``
is eight stages). Read as megatron-core reads it, checked with its own asserts, and the
placements cpmem prices.

Sources at the recordings' snapshot, ``megatron/core/transformer/pipeline_parallel_layer_
layout.py``: the string's parsing (``parse_str_to_list``, 283-321: commas dropped, the
repetitions unrolled, an unknown character refused), the stages over the pipeline ranks
(``__init__``, 40-84: their count a multiple of PP, stage ``v x PP + p`` is virtual stage
``v`` of rank ``p``, so the string lists the virtual stages in order), the layout's
checks (``validate_layer_layout``, 86-151); ``arguments.py:929-951`` (one way to give the
virtual stages, their count) and 825-828 (not with a hybrid pattern);
``transformer_config.py:2242-2259`` (not with the other split flags).

cpmem's pipeline (``cpmem.step.pipeline.Pipeline``) keeps the embedding on the first
virtual stage and the output layer, the loss and the MTP depths on the last, and prices
a layout that places them there: one with the embedding after an empty first stage, the
loss before an empty last one, an empty stage between, or the MTP layers on a rank
before the last (megatron's ``mtp_standalone``) is refused as unpriced.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cpmem.megatron.fields import MegatronArgs
from cpmem.megatron.refused import UNPRICED

LAYER_CHARS = "ELtm"
"""The characters a layout string places (parse_str_to_list, 303-308)."""

FLAG = "--pipeline-model-parallel-layout"


@dataclass(frozen=True)
class StageLayout:
    """A layout string read: each virtual stage's characters, in virtual-stage order."""

    stages: tuple[str, ...]

    @property
    def flat(self) -> str:
        return "".join(self.stages)

    def layers(self) -> tuple[int, ...]:
        """The transformer layers of every virtual stage."""
        return tuple(stage.count("t") for stage in self.stages)


def parse_layout(text: str) -> StageLayout | str:
    """The stages of ``text`` (``parse_str_to_list``: commas dropped, ``(...)*n`` then
    ``x*n`` unrolled, split at ``|``), or the reason it does not read."""
    text = text.replace(",", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    bad = sorted({c for c in text if c not in LAYER_CHARS + "|"})
    if bad:
        return (
            f"Invalid layer character {bad[0]!r}; known layer characters: "
            f"{list(LAYER_CHARS)} (pipeline_parallel_layer_layout.py:315-318)"
        )
    return StageLayout(tuple(text.split("|")))


def layout_of(args: MegatronArgs) -> StageLayout | None:
    """The run's layout where it gives one that reads and fits its pipeline stages
    (``layout_string_problems`` names why not)."""
    text = args.pipeline_model_parallel_layout
    if text is None:
        return None
    parsed = parse_layout(text)
    if isinstance(parsed, str) or len(parsed.stages) % args.pipeline_model_parallel_size:
        return None
    return parsed


def layout_virtual_size(args: MegatronArgs, layout: StageLayout) -> int | None:
    """The model chunks per rank the layout gives, None for one (arguments.py:941-951)."""
    vpp = len(layout.stages) // args.pipeline_model_parallel_size
    return vpp if vpp > 1 else None


def layout_string_problems(args: MegatronArgs) -> list[tuple[str, str]]:
    """Megatron-LM's checks of a layout string and the placements cpmem does not price,
    as (flags, reason) pairs."""
    text = args.pipeline_model_parallel_layout
    if text is None:
        return []
    out = _conflicts(args)
    parsed = parse_layout(text)
    shown = f"{FLAG} {text}"
    if isinstance(parsed, str):
        return [*out, (shown, parsed)]
    pp = args.pipeline_model_parallel_size
    if len(parsed.stages) % pp:
        out.append(
            (
                shown,
                f"The length of pipeline_model_parallel_layout ({len(parsed.stages)} stages) "
                f"must be divisible by pipeline_model_parallel_size ({pp}) "
                "(arguments.py:944-949)",
            )
        )
        return out
    checks = _megatron_checks(args, parsed)
    out += [(shown, why) for why in checks]
    if not checks:
        out += [(shown, UNPRICED + why) for why in _unpriced(args, parsed)]
    return out


def _conflicts(args: MegatronArgs) -> list[tuple[str, str]]:
    """The flags a layout may not be given with."""
    out: list[tuple[str, str]] = []
    for flag, given in (
        ("--num-layers-per-virtual-pipeline-stage", args.num_layers_per_virtual_pipeline_stage),
        ("--num-virtual-stages-per-pipeline-rank", args.num_virtual_stages_per_pipeline_rank),
    ):
        if given is not None:
            out.append(
                (
                    f"{flag} {given} {FLAG}",
                    "No more than one of the following arguments can be set at the same time "
                    "(arguments.py:929-939)",
                )
            )
    split = [
        flag
        for flag, given in (
            ("--decoder-first-pipeline-num-layers", args.decoder_first_pipeline_num_layers),
            ("--decoder-last-pipeline-num-layers", args.decoder_last_pipeline_num_layers),
            (
                "--account-for-embedding-in-pipeline-split",
                args.account_for_embedding_in_pipeline_split or None,
            ),
            (
                "--account-for-loss-in-pipeline-split",
                args.account_for_loss_in_pipeline_split or None,
            ),
        )
        if given is not None
    ]
    if split:
        out.append(
            (
                f"{' '.join(split)} {FLAG}",
                "pipeline_model_parallel_layout cannot be set with other pipeline layout "
                "arguments (transformer_config.py:2242-2259)",
            )
        )
    if args.hybrid_layer_pattern or args.hybrid_override_pattern:
        out.append(
            (
                f"--hybrid-layer-pattern {FLAG}",
                "--pipeline-model-parallel-layout should not be used with --hybrid-layer-pattern "
                "(arguments.py:825-828)",
            )
        )
    return out


def _megatron_checks(args: MegatronArgs, layout: StageLayout) -> list[str]:
    """``validate_layer_layout``'s asserts (pipeline_parallel_layer_layout.py:86-136)."""
    flat, out = layout.flat, []
    if not flat.startswith("E"):
        out.append("The first layer must be embedding (pipeline_parallel_layer_layout.py:95-97)")
    if not flat.endswith("L"):
        out.append("The last layer must be loss (pipeline_parallel_layer_layout.py:98-100)")
    if flat.count("E") != 1:
        out.append(
            "Embedding must be specified exactly once (pipeline_parallel_layer_layout.py:103-105)"
        )
    if flat.count("L") != 1:
        out.append("Loss must be specified exactly once (pipeline_parallel_layer_layout.py:106)")
    if flat.count("t") != args.num_layers:
        out.append(
            f"Number of decoder layers {flat.count('t')} must match num_layers "
            f"{args.num_layers} (pipeline_parallel_layer_layout.py:107-110)"
        )
    mtp = args.mtp_num_layers
    if flat.count("m") != (mtp or 0):
        out.append(
            f"Number of mtp layers in layout ({flat.count('m')}) must match mtp_num_layers "
            f"({mtp}) (pipeline_parallel_layer_layout.py:112-114)"
        )
    if "m" in flat and "t" in flat[flat.index("m") :]:
        out.append(
            "decoder layers must be placed before MTP layers "
            "(pipeline_parallel_layer_layout.py:115-120)"
        )
    pp = args.pipeline_model_parallel_size
    vpp = len(layout.stages) // pp
    for j, stage in enumerate(layout.stages):
        if "m" not in stage:
            continue
        if j // pp != vpp - 1:
            out.append(
                f"the MTP should be always in the last virtual pipeline stage of a rank, not in "
                f"stage {j} (pipeline_parallel_layer_layout.py:121-126)"
            )
        elif stage.count("m") != (mtp or 0):
            out.append(
                "All of the MTP layers must be in the same one virtual pipeline stage "
                "(pipeline_parallel_layer_layout.py:127-131)"
            )
    # 132-136 (none on the first rank's earlier chunks) is within 121-126's check
    return out


def _unpriced(args: MegatronArgs, layout: StageLayout) -> list[str]:
    """Placements megatron runs that cpmem's pipeline does not price (module docstring)."""
    stages, out = layout.stages, []
    last = len(stages) - 1
    if "E" not in stages[0]:
        out.append("the embedding on a virtual stage after the first, empty one")
    if "L" not in stages[last]:
        out.append("the loss on a virtual stage before the last, empty one")
    empty = [j for j in range(1, last) if "t" not in stages[j]]
    if empty and not out:
        out.append(f"virtual stage {empty[0]} holds no transformer layer (an empty pipeline stage)")
    if "m" in layout.flat and "m" not in stages[last]:
        out.append(
            "the MTP layers on a pipeline rank before the last (megatron's mtp_standalone, "
            "pipeline_parallel_layer_layout.py:137-145)"
        )
    return out
