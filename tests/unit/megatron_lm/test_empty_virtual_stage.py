"""A virtual stage with no transformer layer, as Megatron-LM lays it out where the
embedding and the loss count as layers.

megatron-core 0.16 ``get_num_layers_to_build`` (transformer_block.py:147-201): the
layers to split are ``--num-layers`` + 1 for the embedding + 1 for the loss, each rank
takes ``(L + 2) / PP`` of them, each of its ``VPP`` chunks an equal share, and the first
chunk of rank 0 and the last chunk of the last rank one fewer, asserting only that the
count stays ``>= 0``: a chunk of the embedding alone, or of the final norm, the output
layer and the loss alone, is built (an empty ``TransformerBlock`` runs its final norm,
transformer_block.py:798-801). Megatron-LM's ``validate_args`` asks only that ``L + 2``
divide by PP and the rank's share by VPP (arguments.py at the snapshot).

The run: the tiny GPT (hidden 512, 8 heads, GPT-2's vocabulary padded to 50,304, tied
embeddings, learned positions, dropout 0.1, bf16) with 6 layers at PP 4, VPP 2, one
1,024-token sequence per micro-batch, on 4 GPUs (TP 1, DP 1): (6 + 2) / 4 = 2 layers a
rank, 1 a chunk, so virtual stages 0..7 hold 0, 1, 1, 1, 1, 1, 1, 0 layers; stage 0
runs chunk 0 (the embedding alone) and chunk 1 (virtual stage 4), stage 3 chunk 0
(virtual stage 3) and chunk 1 (the loss alone).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpmem.cli import main
from cpmem.errors import InputError
from cpmem.megatron.layout import stage_layer_counts
from cpmem.pricing.pipeline import chunk_step
from cpmem.pricing.registry import price
from cpmem.pricing.tight.policy import price_tight
from cpmem.step.pipeline import Pipeline
from megatron_lm.tiny import step_of, tiny

TOKENS, HIDDEN, VOCAB = 1024, 512, 50_304

ACCOUNTED = {
    "account_for_embedding_in_pipeline_split": True,
    "account_for_loss_in_pipeline_split": True,
}


def _run(layers: int = 6, **changes: object):  # type: ignore[no-untyped-def]
    return tiny(
        num_layers=layers,
        pipeline_model_parallel_size=4,
        num_virtual_stages_per_pipeline_rank=2,
        micro_batch_size=1,
        **{**ACCOUNTED, **changes},
    )


@pytest.mark.parametrize(
    ("layers", "vpp", "accounted", "counts"),
    [
        # (6 + 2) / 4 = 2 a rank, 1 a chunk: the first and last chunks hold none
        (6, 2, ACCOUNTED, (0, 1, 1, 1, 1, 1, 1, 0)),
        # (14 + 2) / 4 = 4 a rank, 2 a chunk
        (14, 2, ACCOUNTED, (1, 2, 2, 2, 2, 2, 2, 1)),
        # no interleaving: (2 + 2) / 4 = 1 a rank
        (2, None, ACCOUNTED, (0, 1, 1, 0)),
        # the embedding alone accounted: (7 + 1) / 4 = 2 a rank, 1 a chunk
        (7, 2, {"account_for_embedding_in_pipeline_split": True}, (0, 1, 1, 1, 1, 1, 1, 1)),
    ],
)
def test_the_split_is_megatrons(
    layers: int, vpp: int | None, accounted: dict[str, bool], counts: tuple[int, ...]
) -> None:
    args = tiny(
        num_layers=layers,
        pipeline_model_parallel_size=4,
        num_virtual_stages_per_pipeline_rank=vpp,
        **accounted,
    )
    assert stage_layer_counts(args) == counts


def test_the_empty_chunks_price_what_they_hold() -> None:
    """The embedding's chunk keeps the token ids and learned position ids (8 B each a
    token) and the embedding dropout's bool mask (1 B an element), beside the data
    loader's ``[1, 1, s, s]`` bool mask; the loss's chunk holds the head: the fp32
    softmax (4 B a logit) and 21 B a token of labels, masks and losses kept, the final
    norm's input and output (bf16) kept for the trained output layer, and at its forward
    peak the bf16 logits (2 B a logit) and the norm's output it reads."""
    step = step_of(_run(), world_size=4)
    micro = step.microbatch_steps[0]
    embedding = price_tight(chunk_step(step, micro, 0, 0))
    ids = 8 * TOKENS * 2
    mask = TOKENS * HIDDEN
    loader = TOKENS * TOKENS
    held = {name: b for name, b in embedding.components.items() if b}
    assert held == {"embedding": ids + mask, "dataloader_mask": loader}
    loss = price_tight(chunk_step(step, micro, 3, 1))
    logits = TOKENS * VOCAB
    kept = 4 * logits + 21 * TOKENS + 2 * TOKENS * HIDDEN * 2
    forward = 2 * logits + TOKENS * HIDDEN * 2
    assert loss.components["head_kept"] == kept
    assert loss.components["head"] == forward
    assert loss.estimate_bytes == kept + forward + loader


def test_the_step_is_priced_and_the_last_stage_holds_its_warm_up() -> None:
    """Stage 3 runs 4 warm-up forwards of chunk 0 (``(vpp - 1) x pp``), then micro-batch
    0's chunk 1, the loss alone: its forward peak is the four chunks in flight (each its
    kept bytes and the input it received, 1,024 x 512 bf16) and the loss chunk's own
    figure, which keeps no received input of its own (the head's kept bytes hold the
    final norm's input)."""
    step = step_of(_run(), world_size=4)
    est = price(step, "tight")
    micro = step.microbatch_steps[0]
    layer = price_tight(chunk_step(step, micro, 3, 0))
    loss = price_tight(chunk_step(step, micro, 3, 1))
    received = TOKENS * HIDDEN * 2
    assert est.stage_bytes[3] == 4 * (layer.retained_bytes + received) + loss.estimate_bytes
    assert est.head.label == "logits"  # the step's head, whichever stage is busiest


def test_the_command_line_prices_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flags = tmp_path / "tiny_pp4_vpp2.txt"
    flags.write_text(
        "--num-layers 6 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 "
        "--max-position-embeddings 1024 --micro-batch-size 1 --global-batch-size 32 --bf16 "
        "--pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2 "
        "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split "
        "--vocab-size 50257 --tokenizer-type NullTokenizer"
    )
    code = main(["estimate", "--megatron-args", str(flags), "--world-size", "4", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["head"] == "logits" and len(out["stage_bytes"]) == 4


def test_only_the_first_and_last_virtual_stages_may_be_empty() -> None:
    Pipeline(pp=2, vpp=2, microbatches=2, layers=(0, 2, 2, 0))
    with pytest.raises(InputError, match=r"virtual stage 1 holds no layer"):
        Pipeline(pp=2, vpp=2, microbatches=2, layers=(2, 0, 2, 0))
