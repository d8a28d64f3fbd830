"""Per-layer CUDA graphs (``--cuda-graph-impl transformer_engine`` with its modules): what
they keep allocated, and the combinations refused.

The run is Megatron-LM's scoped CUDA-graph case
(``golden/megatron/cases/moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph``) with
its FP8 flags left out (its blockwise recipe is refused apart): 13 layers of hidden 512,
the first 4 dense and 9 MoE (8 experts, top-2, a shared expert), one MTP depth, TP 4 with
SP, EP 2, PP 2 over the layout ``Et|(tt|)*6mL`` (4 virtual stages each), micro-batch 2 of
1,024 tokens, global batch 32 over DP 2: 8 micro-batches; modules ``attn mlp moe_router
moe_preprocess``. Every expected byte is counted here by hand from megatron-core's source
(Megatron-LM d98e8a64) and Transformer Engine's (b9d690e0), each line cited.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cpmem.errors import InputError
from cpmem.megatron.args import parse_megatron_args, read_megatron_args
from cpmem.megatron.describe import describe_megatron
from cpmem.pricing.registry import price
from cpmem.pricing.static import static_memory

ROOT = Path(__file__).resolve().parents[3]
CASES = ROOT / "golden/megatron/cases/moe"
SCOPED = "gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph"
FP8_LINES = ("--fp8-format", "--fp8-recipe", "--first-last-layers-bf16")

# static inputs (module.py:256-272, transformer_layer.py:1222-1232): hidden_states
# [s/cp/tp = 256, b = 2, h = 512] in bf16 and the causal mask [b = 2, 1, 1024, 1024] bool
HIDDEN = 256 * 2 * 512 * 2
MASK = 2 * 1024 * 1024 * 1
# output gradients (graph.py:669-684): a layer's [256, 2, 512] bf16 output; an MoE layer to
# its preprocess: 512 local tokens x top-2 = 1,024 permuted rows of 512 bf16 and their
# fp32 probabilities, the fp32 probabilities over 8 experts, the shared experts' output
# and the residual ([256, 2, 512] bf16 each)
LAYER_OUTPUT = HIDDEN
MOE_OUTPUTS = 1024 * 512 * 2 + 1024 * 4 + 512 * 8 * 4 + HIDDEN + HIDDEN


def _case(tmp_path: Path, name: str, drop: tuple[str, ...] = ()) -> Path:
    text = (CASES / name / "model_config.yaml").read_text(encoding="utf-8")
    kept = [ln for ln in text.splitlines() if not ln.strip().startswith(FP8_LINES + drop)]
    path = tmp_path / "model_config.yaml"
    path.write_text("\n".join(kept) + "\n", encoding="utf-8")
    return path


def _graph_bytes(path: Path, world: int, rank: str | int = "last", **changes: object) -> int:
    args = read_megatron_args(path)
    if changes:
        args = parse_megatron_args({**args.flag_values, **changes})
    step = describe_megatron(args, world_size=world, rank=rank, device="h100")
    static = static_memory(step.settings, step=step)
    return dict(static.components).get("cuda_graph_buffers", 0)


def test_the_last_stage_keeps_fourteen_input_sets_and_two_output_gradient_sets(
    tmp_path: Path,
) -> None:
    """Stage 1 holds virtual stages 1, 3, 5 and 7: layers 2-3, 6-7, 10-11 and the MTP
    layer, graphed layers per chunk [2, 2, 2, 1]. Its interleaved order (schedules.py,
    group 2): 6 warm-up forwards, chunks 0, 0, 1, 1, 2, 2 of micro-batches 0 and 1 = 12
    sets; then F(m0, c3) +1 = 13, B(m0, c3) frees 1, F(m1, c3) reuses it, B(m1, c3) frees
    1, F(m2, c0) needs 2: reuses 1 and allocates 1 = 14; from there every backward frees
    what the next forward needs (cuda_graphs.py:2322-2565 reuses freed sets). Outputs:
    the dense layers' one set and the MoE layers' one set (keyed by shape)."""
    path = _case(tmp_path, SCOPED)
    expected = 14 * (HIDDEN + MASK) + LAYER_OUTPUT + MOE_OUTPUTS
    assert expected == 39_342_080
    assert _graph_bytes(path, 8) == expected


def test_without_a_pipeline_one_micro_batch_is_captured(tmp_path: Path) -> None:
    """The 1-node case runs PP 1 (world 4): one micro-batch captured
    (cuda_graphs.py:2597-2603), forward then backward, so every graphed layer keeps its
    own set: 13 layers and the MTP layer. Under ``attn`` alone every layer's graph ends
    at its attention: one output signature, the layer's [256, 2, 512] output."""
    path = _case(tmp_path, SCOPED + "_1node")
    assert _graph_bytes(path, 4, **{"--cuda-graph-modules": "[attn]"}) == (
        14 * (HIDDEN + MASK) + LAYER_OUTPUT
    )


def test_the_mask_is_kept_only_where_the_attention_is_graphed(tmp_path: Path) -> None:
    """Under ``moe_router`` alone only the 9 MoE layers and the MTP layer are graphed,
    each from its pre-MLP norm (transformer_layer.py:1222-1232: no mask without attn):
    10 hidden_states, and the MoE outputs to the router without preprocess: the norm's
    output, the probabilities over 8 experts (fp32), the shared experts' output and the
    residual."""
    path = _case(tmp_path, SCOPED + "_1node")
    router_outputs = HIDDEN + 512 * 8 * 4 + HIDDEN + HIDDEN
    assert _graph_bytes(path, 4, **{"--cuda-graph-modules": "[moe_router]"}) == (
        10 * HIDDEN + router_outputs
    )


def test_the_graph_buffers_are_static_memory_in_the_peak(tmp_path: Path) -> None:
    """The buffers are allocated at capture and kept: the static memory and the peak
    both move by them."""
    graphed = read_megatron_args(_case(tmp_path, SCOPED))
    eager = read_megatron_args(_case(tmp_path, SCOPED, drop=("--cuda-graph",)))
    est = [
        price(describe_megatron(a, world_size=8, rank="last", device="h100"), "tight")
        for a in (graphed, eager)
    ]
    assert est[0].static is not None and est[1].static is not None
    assert est[0].static.total - est[1].static.total == 39_342_080
    assert est[0].peak_bytes - est[1].peak_bytes == 39_342_080


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        ({"--cuda-graph-impl": "local"}, "CudaGraphManager"),
        ({"--enable-cuda-graph": True}, "CudaGraphManager"),
        ({"--cuda-graph-impl": "full_iteration"}, "whole iteration"),
        (
            {"--cuda-graph-scope": "[attn]", "--cuda-graph-modules": "[attn]"},
            "cannot be set together",
        ),
        (
            {"--enable-cuda-graph": True, "--cuda-graph-impl": "transformer_engine"},
            "Do not use enable_cuda_graph",
        ),
        ({"--recompute-granularity": "full"}, "full recompute is only supported"),
    ],
)
def test_the_door_refuses_what_megatron_rejects_or_cpmem_does_not_price(
    tmp_path: Path, flags: dict[str, object], says: str
) -> None:
    args = read_megatron_args(_case(tmp_path, SCOPED))
    with pytest.raises(InputError) as err:
        parse_megatron_args({**args.flag_values, **flags})
    assert says in str(err.value)


@pytest.mark.parametrize(
    ("modules", "says"),
    [
        ("[attn moe_preprocess]", "moe_preprocess cuda graph is only supported with moe_router"),
        ("[moe moe_router]", "must not contain both moe and moe_router"),
        ("[moe]", "drop-and-pad"),
        ("[]", "drop-and-pad"),
    ],
)
def test_the_step_refuses_the_modules_megatron_rejects_on_the_model(
    tmp_path: Path, modules: str, says: str
) -> None:
    """transformer_config.py:2817-2844, read on the model's layers."""
    path = _case(tmp_path, SCOPED)
    with pytest.raises(InputError) as err:
        _graph_bytes(path, 8, **{"--cuda-graph-modules": modules})
    assert says in str(err.value)


def test_the_deprecated_switch_and_scope_are_read_as_megatron_core_reads_them(
    tmp_path: Path,
) -> None:
    """--external-cuda-graph is transformer_engine, --cuda-graph-scope the modules
    (transformer_config.py:2706-2739)."""
    path = _case(tmp_path, SCOPED, drop=("--cuda-graph",))
    assert (
        _graph_bytes(
            path,
            8,
            **{
                "--external-cuda-graph": True,
                "--cuda-graph-scope": "[attn mlp moe_router moe_preprocess]",
            },
        )
        == 14 * (HIDDEN + MASK) + LAYER_OUTPUT + MOE_OUTPUTS
    )
