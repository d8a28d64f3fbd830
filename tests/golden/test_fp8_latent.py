"""FP8 on latent attention (``cpmem.pricing.fp8_static``' roles and scaling GEMMs,
``cpmem.pricing.kinds.fp8.latent_fp8_width``) on Megatron-LM's
``deepseek_proxy_fsdp_ep2_fsdp2_1node`` case (GB200, 4 GPUs: 2 layers, a dense one then an
MoE one, hidden 512, 8 heads, latent attention with ``q_lora_rank`` 256, ``kv_lora_rank``
128, ``qk_head_dim`` 128 + rope 64, ``v_head_dim`` 128, ffn 2048 (SwiGLU), 8 experts of 1024
top-4 over EP 2, a shared expert of 1024, TP 1, the unfused attention backend, tensorwise
FP8 with ``--fp8-param-gather``), read with ``--bf16`` (the recording runs fp32 parameters,
refused) and, for the DDP figures, without Megatron FSDP and ``--fp8-param-gather``: the run
without FP8 is the reference, so only what Transformer Engine keeps for FP8 may differ.

Hand figures. Each FP8 weight on a rank, ``[out, in]`` (megatron-core 0.16's TE layer spec:
every latent-attention projection a TE linear):

- latent attention (2 layers): q_down ``[256, 512]`` = 131,072, q_up ``[8 x 192, 256]`` =
  393,216, kv_down ``[128 + 64, 512]`` = 98,304, kv_up ``[8 x (128 + 128), 128]`` = 262,144,
  proj ``[512, 8 x 128]`` = 524,288: 1,409,024 a layer;
- the dense MLP (layer 0): fc1 ``[2 x 2048, 512]`` = 2,097,152, fc2 ``[512, 2048]`` =
  1,048,576;
- the MoE block (layer 1): the shared expert's fc1 ``[2 x 1024, 512]`` = 1,048,576 and fc2
  ``[512, 1024]`` = 524,288, and 8 / 2 = 4 local experts' fc1 and fc2, the same shapes.

2 x 1,409,024 + 3,145,728 + 5 x 1,572,864 = 13,828,096 elements, every weight a whole
number of 512 B blocks; 2 x 5 + 2 + 2 + 8 = 22 weights, each with one 512 B scale inverse.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from cpmem.api import describe_megatron
from cpmem.gate.tier_vocab import tier_vocab
from cpmem.golden.files import default_golden_dir
from cpmem.megatron.args import read_megatron_args
from cpmem.pricing.fp8_static import scaling_gemms
from cpmem.pricing.registry import price
from cpmem.pricing.tight.compose import tight_widths
from cpmem.step.recompute import Recompute
from cpmem.step.step import Step

CASE = default_golden_dir() / "megatron/cases/moe/deepseek_proxy_fsdp_ep2_fsdp2_1node"
FSDP = re.compile(
    r"^\s*--(use-megatron-fsdp|data-parallel-sharding-strategy|outer-dp-sharding"
    r"|ckpt-format|fp8-param-gather)\b"
)
FP8 = re.compile(r"^\s*--(fp8-format|fp8-recipe|fp8-param-gather)\b")

LATENT = 131_072 + 393_216 + 98_304 + 262_144 + 524_288
FP8_ELEMENTS = 13_828_096
SCALE_INVERSES = 22 * 512


def _step(tmp: Path, device: str, drop: re.Pattern[str], *, fp8: bool = True, **edits: str) -> Step:
    source = CASE / "model_config.yaml"
    text = source.read_text(encoding="utf-8")
    for old, new in edits.items():
        text = text.replace(old, new)
    lines = [line for line in text.splitlines() if not drop.match(line)]
    lines = [line for line in lines if fp8 or not FP8.match(line)]
    at = lines.index("MODEL_ARGS:") + 1
    lines.insert(at, "  --bf16: true")
    path = tmp / f"{device}-{fp8}.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    args = read_megatron_args(path, vocab_size=tier_vocab(source))
    return describe_megatron(args, world_size=4, device=device, rank="last")


def test_the_hand_figures() -> None:
    assert LATENT == 1_409_024
    assert 2 * LATENT + (2_097_152 + 1_048_576) + 5 * (1_048_576 + 524_288) == FP8_ELEMENTS


@pytest.mark.parametrize(("device", "transposes"), [("h100", FP8_ELEMENTS), ("gb200", 0)])
def test_the_static_terms_are_the_bf16_run_and_the_fp8_copies(
    tmp_path: Path, device: str, transposes: int
) -> None:
    """Without ``--fp8-param-gather`` (megatron-core's DDP): the bf16 buffers as without FP8,
    and Transformer Engine's cached 1 B copy of every FP8 weight, its transpose before
    compute capability 10 and its scale inverse."""
    fp8 = dict(price(_step(tmp_path, device, FSDP), "tight").static.components)  # type: ignore[union-attr]
    bf16 = price(_step(tmp_path, device, FSDP, fp8=False), "tight").static.components  # type: ignore[union-attr]
    assert fp8.pop("fp8_weight_cache") == FP8_ELEMENTS
    assert fp8.pop("fp8_transposes") == transposes
    assert fp8.pop("fp8_scale_inverses") == SCALE_INVERSES
    assert fp8 == bf16


def test_delayed_scaling_keeps_a_state_per_latent_projection(tmp_path: Path) -> None:
    """Per GEMM a forward scale and amax history (3 quantizers, 12 B each: one 512 B block
    apiece) and a backward pair (2 quantizers), 2,048 B; a local experts' GroupedLinear of
    4 GEMMs the same (48 B and 32 B, each under a block). Latent attention: 5 projections
    and DotProductAttention's 3 GEMMs (one module, 36 B and 24 B): 6 x 2,048 = 12,288 B a
    layer; the dense MLP 2 x 2,048; the MoE block's shared fc1 and fc2 and the experts' fc1
    and fc2 4 x 2,048: 2 x 12,288 + 4,096 + 8,192 = 36,864 B."""
    step = _step(
        tmp_path, "h100", FSDP, **{'--fp8-recipe: "tensorwise"': '--fp8-recipe: "delayed"'}
    )
    assert scaling_gemms(step.geometry, "attention", 2) == (1, 1, 1, 1, 1, 3)
    assert price(step, "tight").static.components["fp8_scaling_state"] == 36_864  # type: ignore[union-attr]


def _attention(step: Step, backend: str, modules: str | None = None) -> int:
    runtime = replace(step.settings.runtime, attention_backend=backend)
    recompute = Recompute.parse("selective", modules) if modules else step.settings.recompute
    given = replace(step, settings=replace(step.settings, runtime=runtime, recompute=recompute))
    return tight_widths(given.geometry, given).fp8_attention


def test_the_saved_inputs_by_hand(tmp_path: Path) -> None:
    """Per token, b = 2, TP 1: the input norm's output (512) goes from 2 B to the two down
    projections' 1 B copies, 0 B; the fused q and kv norms' outputs (256 + 128) lose 1 B an
    element, -384 B; the output projection's input (8 x 128 = 1,024): beside a flash or
    fused kernel's bf16 output +1,024 B, so +640 B = 320 elements; the unfused kernel (the
    case's) and a ``core_attn`` checkpoint keep no output, so it is the projection's alone,
    -1,024 B: -1,408 B = -704 elements."""
    step = _step(tmp_path, "gb200", FSDP)
    assert step.settings.runtime.attention_backend == "unfused"
    assert tight_widths(step.geometry, step).fp8_attention == -704
    assert _attention(step, "flash") == 320
    assert _attention(step, "fused") == 320
    assert _attention(step, "flash", "core_attn") == -704


def test_blockwise_scales_of_the_saved_inputs(tmp_path: Path) -> None:
    """Blockwise: 4 B per 128 rows of each saved input's columns (padded to 4): 512 + 512 +
    256 + 128 + 1,024 = 2,432 columns, 76 B a token: the flash kernel's +640 B becomes
    +716 B = 358 elements."""
    step = _step(
        tmp_path, "h100", FSDP, **{'--fp8-recipe: "tensorwise"': '--fp8-recipe: "blockwise"'}
    )
    assert _attention(step, "flash") == 358


def test_the_fsdp_run_prices_fp8_on_its_latent_and_moe_layers(tmp_path: Path) -> None:
    """Under Megatron FSDP (optim_grads_params, ``--fp8-param-gather``) the 22 FP8 weights
    each keep a scale inverse, and the routed experts' FP8 weights are a uint8 bucket of
    their own (``cpmem.pricing.fsdp``)."""
    step = _step(tmp_path, "gb200", re.compile(r"^$"))
    assert step.settings.optimizer.fsdp == "optim_grads_params"
    static = price(step, "tight").static.components  # type: ignore[union-attr]
    assert static["fp8_scale_inverses"] == SCALE_INVERSES
    assert "fp8_transposes" not in static
