"""``tight``'s MTP depth (``compose.mtp_bytes``) against the rank simulator's
(oracles/rank_sim/mtp.py, Megatron-LM's ``MultiTokenPredictionLayer`` and
``process_mtp_loss`` restated): one depth after a two-layer decoder (attention + gated
MLP with q/k norm, hidden 256, vocabulary 1,000), head ``logits``, 1,024 tokens, no
recompute, at TP 1 and TP 2 with SP, under LoRA and full training. What one depth adds
to the rank's kept set, per token, in both: the simulator's retained bytes with
``mtp_depths=1`` beyond ``mtp_depths=0`` (the batch's ids and mask aside, priced with the
batch), and tight's MTP component. tight covers it and stays within 5%.

Measured when written (bytes per token, tight over the simulator): LoRA +195.5 of
13,177.5 at TP 1 (+1.5%), +101.5 of 7,879.5 at TP 2 (+1.3%); full +703.5 of 15,229.5
(+4.6%), +352.5 of 7,884.5 (+4.5%).
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from cpmem.api import describe_step  # noqa: E402
from cpmem.model.geometry import ModelGeometry  # noqa: E402
from cpmem.pricing.components import Component  # noqa: E402
from cpmem.pricing.registry import price  # noqa: E402
from oracles.rank_sim.geometry import SimModel  # noqa: E402
from oracles.rank_sim.layout import GdnPiece, RankLayout  # noqa: E402
from oracles.rank_sim.recompute import Recompute  # noqa: E402
from oracles.rank_sim.runner import simulate_rank  # noqa: E402

warnings.filterwarnings("ignore")

N = 1024
H, F, HQ, HKV, D, VOCAB = 256, 512, 8, 4, 32, 1000
BATCH = ("labels", "mpu_buffer")  # the batch's tensors, priced with the batch
TOLERANCE = 0.05


def _simulated(tp: int, training: str) -> int:
    model = SimModel(
        "small", H, F, HQ, HKV, D, False, True, ("attention",) * 2, vocab=VOCAB, family="qwen3"
    )
    layout = RankLayout(tp, 1, 0, (N,), (N,), (GdnPiece(N),), N, True)
    kept = []
    for depths in (1, 0):
        r = simulate_rank(
            model, layout, Recompute.parse("none", ""), head="logits",
            mtp_depths=depths, training=training,
        )  # fmt: skip
        kept.append(sum(v for k, v in r.components["retained"].items() if k not in BATCH))
    return kept[0] - kept[1]


def _tight(tp: int, training: str) -> int:
    g = ModelGeometry(
        name="small", hidden=H, mixers=("attention",) * 2, mlps=("dense",) * 2, q_heads=HQ,
        kv_groups=HKV, head_dim=D, vocab=VOCAB, ffn=F, gated_mlp=True, qk_norm=True,
        positions="rope", norm="rmsnorm",
    )  # fmt: skip
    g = replace(g, mtp_mixers=("attention",), mtp_mlps=("dense",), mtp_depths=1)
    lora = {"lora_rank": 1} if training == "lora" else {}
    step = describe_step(
        g, [N], tp=tp, runtime="megatron-lm", training=training, attention_backend="flash",
        head="logits", recompute="none", **lora,
    )  # fmt: skip
    return price(step, "tight").components[Component.MTP]


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("training", ["lora", "full"])
def test_one_depth_covers_the_simulated_depth_within_five_percent(training: str, tp: int) -> None:
    simulated, tight = _simulated(tp, training), _tight(tp, training)
    assert simulated <= tight <= simulated * (1 + TOLERANCE), tight / simulated - 1
