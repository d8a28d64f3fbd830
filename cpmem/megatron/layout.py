"""The pipeline's layer split as Megatron-LM cuts it: how many model chunks each
pipeline rank holds (``virtual_pipeline_size``), how many transformer layers each
virtual stage builds (``stage_layer_counts``), and Megatron-LM's own checks of the split
(``layout_problems``).

Sources at the snapshot: ``validate_args`` (``megatron/training/arguments.py:927-1009``)
derives the virtual pipeline size; ``get_num_layers_to_build``
(``megatron/core/transformer/transformer_block.py:76-203``) gives a (pipeline rank,
virtual stage) its layers; ``get_transformer_layer_offset``
(``megatron/core/transformer/transformer_layer.py:65-200``) places virtual stage ``v`` of
rank ``p`` after every stage of the chunks before it, so the model's layers run through
the virtual stages in the order ``v * PP + p``; ``TransformerConfig.__post_init__``
(``transformer_config.py:2229-2415``) checks an uneven split.

A hybrid pattern cut by ``|`` is the split itself: segment ``v x PP + p`` is virtual stage
``v`` of pipeline rank ``p``, and there are segments / PP chunks per rank
(``arguments.py:841-862``, ``hybrid_layer_allocation.select_pipeline_segment``); without
``|`` the layers split as a GPT's do (evenly, or with ``--decoder-first/last-pipeline-
num-layers``).

A layout string (``--pipeline-model-parallel-layout``, ``cpmem.megatron.pipeline_layout``)
is the split too: its stages are the virtual stages in order, each holding its ``t``
count, and there are stages / PP chunks per rank (arguments.py:941-951).
"""

from __future__ import annotations

from cpmem.megatron.fields import MegatronArgs
from cpmem.megatron.hybrid_pattern import HybridPattern, parse_hybrid_pattern
from cpmem.megatron.pipeline_layout import layout_of, layout_string_problems, layout_virtual_size


def hybrid_segments(args: MegatronArgs) -> tuple[int, ...] | None:
    """The layer counts of a hybrid pattern's ``|`` segments, in virtual-stage order; None
    without a pattern cut by ``|`` (or with one that does not read: its problems are
    named by the rules)."""
    text = args.hybrid_layer_pattern or args.hybrid_override_pattern
    if text is None:
        return None
    parsed = parse_hybrid_pattern(text)
    if not isinstance(parsed, HybridPattern) or not parsed.piped:
        return None
    return parsed.segments


def _uneven(args: MegatronArgs) -> bool:
    return (
        args.decoder_first_pipeline_num_layers is not None
        or args.decoder_last_pipeline_num_layers is not None
    )


def _accounted_layers(args: MegatronArgs) -> int:
    """The layers the even split divides: the embedding and the loss count as one layer
    each where ``--account-for-*-in-pipeline-split`` says so (arguments.py:962-966,
    transformer_block.py:148-158)."""
    return (
        args.num_layers
        + int(args.account_for_embedding_in_pipeline_split)
        + int(args.account_for_loss_in_pipeline_split)
    )


def virtual_pipeline_size(args: MegatronArgs) -> int | None:
    """Megatron-LM's ``virtual_pipeline_model_parallel_size``: the model chunks per
    pipeline rank, None for one (arguments.py:953-979).

    ``--num-virtual-stages-per-pipeline-rank N`` is N; ``--num-layers-per-virtual-
    pipeline-stage K`` is (layers per pipeline stage) / K, the layers counting the
    embedding and loss where accounted for; 1 becomes None. A hybrid pattern cut by ``|``
    into more segments than pipeline stages has segments / PP (arguments.py:841-862), a
    layout string stages / PP (arguments.py:941-951)."""
    segments = hybrid_segments(args)
    if segments is not None:
        vpp = len(segments) // args.pipeline_model_parallel_size
        return vpp if vpp > 1 else None
    layout = layout_of(args)
    if layout is not None:
        return layout_virtual_size(args, layout)
    if args.num_virtual_stages_per_pipeline_rank is not None:
        vpp = args.num_virtual_stages_per_pipeline_rank
    elif args.num_layers_per_virtual_pipeline_stage is not None:
        per_stage = _accounted_layers(args) // args.pipeline_model_parallel_size
        vpp = per_stage // args.num_layers_per_virtual_pipeline_stage
    else:
        return None
    return None if vpp == 1 else vpp


def _rank_layers(args: MegatronArgs, rank: int) -> int:
    """Layers of pipeline rank ``rank`` before the embedding's or loss's share is taken
    off (transformer_block.py:104-158)."""
    pp = args.pipeline_model_parallel_size
    first, last = args.decoder_first_pipeline_num_layers, args.decoder_last_pipeline_num_layers
    if first is None and last is None:
        return _accounted_layers(args) // pp
    if rank == 0 and first is not None:
        return first
    if rank == pp - 1 and last is not None:
        return last
    middle_stages = pp - (first is not None) - (last is not None)
    middle_layers = args.num_layers - (first or 0) - (last or 0)
    return middle_layers // middle_stages if middle_stages > 0 else 0


def stage_layer_counts(args: MegatronArgs) -> tuple[int, ...] | None:
    """The transformer layers of every virtual stage in virtual-stage order (stage
    ``v * PP + p`` is chunk ``v`` of pipeline rank ``p``; PP entries without virtual
    stages), as ``get_num_layers_to_build`` cuts them; None for the even split (no
    ``--decoder-first/last-pipeline-num-layers``, no ``--account-for-*``), where every
    virtual stage holds layers / (PP x chunks).

    Each rank's layers are divided evenly over its chunks (transformer_block.py:160-
    188); the first chunk of rank 0 builds one layer fewer under ``--account-for-
    embedding-in-pipeline-split``, the last chunk of the last rank one fewer under
    ``--account-for-loss-in-pipeline-split`` (transformer_block.py:191-200). The split
    is assumed valid (``layout_problems`` is empty). A hybrid pattern cut by ``|``: its
    segments' layer counts; a layout string: its stages' transformer layers."""
    segments = hybrid_segments(args)
    if segments is not None:
        return segments
    layout = layout_of(args)
    if layout is not None:
        return layout.layers()
    if not (
        _uneven(args)
        or args.account_for_embedding_in_pipeline_split
        or args.account_for_loss_in_pipeline_split
    ):
        return None
    pp = args.pipeline_model_parallel_size
    vpp = virtual_pipeline_size(args) if pp > 1 else None
    chunks = vpp or 1
    counts: list[int] = []
    for v in range(chunks):
        for p in range(pp):
            n = _rank_layers(args, p) // chunks
            if args.account_for_embedding_in_pipeline_split and v == 0 and p == 0:
                n -= 1
            if args.account_for_loss_in_pipeline_split and v == chunks - 1 and p == pp - 1:
                n -= 1
            counts.append(n)
    return tuple(counts)


def layout_problems(args: MegatronArgs) -> list[tuple[str, str]]:
    """Megatron-LM's checks of the split, as (flags, its reason) pairs. A layout string
    (``--pipeline-model-parallel-layout``) places the layers its own way: its own checks
    (``cpmem.megatron.pipeline_layout``) and the interleaved schedule's apply, not the
    even split's (arguments.py:941-951)."""
    segments = hybrid_segments(args)
    if segments is not None:
        return _segment_problems(args, segments)
    if args.pipeline_model_parallel_layout is not None:
        problems = layout_string_problems(args)
        layout = layout_of(args)
        vpp = None if layout is None else layout_virtual_size(args, layout)
        return problems or _interleaved_problems(args, vpp)
    out: list[tuple[str, str]] = []
    pp = args.pipeline_model_parallel_size
    per_virtual = args.num_layers_per_virtual_pipeline_stage
    count = args.num_virtual_stages_per_pipeline_rank
    accounted = args.account_for_embedding_in_pipeline_split or (
        args.account_for_loss_in_pipeline_split
    )
    if per_virtual is not None and count is not None:
        out.append(
            (
                f"--num-layers-per-virtual-pipeline-stage {per_virtual} "
                f"--num-virtual-stages-per-pipeline-rank {count}",
                "no more than one of the two may be set (arguments.py:927-939)",
            )
        )
        return out
    if per_virtual is not None and _uneven(args):
        out.append(
            (
                f"--num-layers-per-virtual-pipeline-stage {per_virtual}",
                "with an uneven first or last stage, give the virtual stages by "
                "--num-virtual-stages-per-pipeline-rank (arguments.py:955-956)",
            )
        )
        return out
    if _uneven(args) and accounted:
        out.append(
            (
                "--decoder-first/last-pipeline-num-layers with --account-for-*-in-pipeline-split",
                "cannot be set at the same time (transformer_config.py:2229-2239)",
            )
        )
        return out
    vpp = virtual_pipeline_size(args)
    if not _uneven(args):
        layers = _accounted_layers(args)
        if layers % pp:
            what = "--num-layers" + (" with the embedding or loss accounted" if accounted else "")
            out.append(
                (
                    f"--num-layers {args.num_layers}",
                    f"{what} ({layers}) does not split evenly over {pp} pipeline stages "
                    "(arguments.py:968-969, 985-998)",
                )
            )
            return out
        per_stage = layers // pp
        if per_virtual is not None and per_stage % per_virtual:
            out.append(
                (
                    f"--num-layers-per-virtual-pipeline-stage {per_virtual}",
                    f"does not divide each pipeline stage's {per_stage} layers "
                    "(arguments.py:972-973)",
                )
            )
        elif count is not None and per_stage % count:
            out.append(
                (
                    f"--num-virtual-stages-per-pipeline-rank {count}",
                    f"does not divide each pipeline stage's {per_stage} layers "
                    "(transformer_block.py:174-178, transformer_config.py:2403-2415)",
                )
            )
    else:
        out.extend(_uneven_problems(args, vpp))
    return out + _interleaved_problems(args, vpp)


def _interleaved_problems(args: MegatronArgs, vpp: int | None) -> list[tuple[str, str]]:
    """The interleaved schedule's pipeline size (arguments.py:1000-1009)."""
    if vpp is None:
        return []
    pp = args.pipeline_model_parallel_size
    overlap = args.flag_values.get("--no-overlap-p2p-communication") is not True
    if overlap and pp < 2:
        return [
            (
                f"--pipeline-model-parallel-size {pp}",
                "the interleaved schedule needs more than one pipeline stage "
                "(arguments.py:1000-1004)",
            )
        ]
    if not overlap and pp < 3:
        return [
            (
                f"--pipeline-model-parallel-size {pp} --no-overlap-p2p-communication",
                "the interleaved schedule without P2P overlap needs more than two "
                "pipeline stages (arguments.py:1005-1009)",
            )
        ]
    return []


def _uneven_problems(args: MegatronArgs, vpp: int | None) -> list[tuple[str, str]]:
    """transformer_config.py:2295-2368: the first and last stages' layers, and the middle
    stages' share."""
    out: list[tuple[str, str]] = []
    pp = args.pipeline_model_parallel_size
    middle_layers, middle_stages = args.num_layers, pp
    for flag, n, positive, divisible in (
        (
            "--decoder-first-pipeline-num-layers",
            args.decoder_first_pipeline_num_layers,
            2304,
            "2306-2317",
        ),
        (
            "--decoder-last-pipeline-num-layers",
            args.decoder_last_pipeline_num_layers,
            2323,
            "2325-2336",
        ),
    ):
        if n is None:
            continue
        if n <= 0:
            out.append((f"{flag} {n}", f"must be larger than 0 (transformer_config.py:{positive})"))
            return out
        if vpp is not None and n % vpp:
            out.append(
                (
                    f"{flag} {n}",
                    f"must be divisible by the virtual pipeline size {vpp} "
                    f"(transformer_config.py:{divisible})",
                )
            )
        middle_layers -= n
        middle_stages -= 1
    if bool(middle_layers) != bool(middle_stages):
        out.append(
            (
                f"--num-layers {args.num_layers}",
                f"leaves {middle_layers} layers for {middle_stages} middle pipeline stages "
                "(transformer_config.py:2340-2345)",
            )
        )
    elif middle_stages and middle_layers % middle_stages:
        out.append(
            (
                f"--num-layers {args.num_layers}",
                f"leaves {middle_layers} middle layers, not divisible by the "
                f"{middle_stages} middle pipeline stages (transformer_config.py:2347-2353)",
            )
        )
    elif middle_stages and vpp is not None and (middle_layers // middle_stages) % vpp:
        out.append(
            (
                f"--num-virtual-stages-per-pipeline-rank {vpp}",
                f"does not divide each middle pipeline stage's {middle_layers // middle_stages}"
                " layers (transformer_config.py:2357-2368)",
            )
        )
    return out


def _segment_problems(args: MegatronArgs, segments: tuple[int, ...]) -> list[tuple[str, str]]:
    """A pattern cut by ``|``: the segments must be a multiple of the pipeline stages
    (arguments.py:849-854), and the interleaved schedule's stage count holds
    (arguments.py:1000-1009); the flags that would cut the layers otherwise are the
    pattern rules' (``cpmem.megatron.stack_rules``)."""
    out: list[tuple[str, str]] = []
    pp = args.pipeline_model_parallel_size
    if len(segments) % pp:
        out.append(
            (
                f"--hybrid-layer-pattern with {len(segments)} segments",
                "The number of hybrid pipeline segments described by --hybrid-layer-pattern "
                f"must be evenly divisible by --pipeline-model-parallel-size ({pp}) "
                "(arguments.py:849-854)",
            )
        )
        return out
    if len(segments) > pp:
        overlap = args.flag_values.get("--no-overlap-p2p-communication") is not True
        if (overlap and pp < 2) or (not overlap and pp < 3):
            out.append(
                (
                    f"--pipeline-model-parallel-size {pp} with {len(segments)} pattern segments",
                    "the interleaved schedule needs more than "
                    f"{'one pipeline stage' if overlap else 'two pipeline stages'} "
                    "(arguments.py:1000-1009)",
                )
            )
    return out
