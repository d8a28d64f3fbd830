"""Muon's optimizer-step transient (``cpmem.pricing.muon_step``) and where it moves the
peak (``registry._with_optimizer_step``).

Expected bytes counted by hand from the snapshot's source (Megatron-LM d98e8a64
``TensorParallelMuon``, Emerging-Optimizers v0.3.0 ``muon_utils.py``), for a local fp32
``[r, c]`` matrix, ``N = r c``, gathered over ``T`` ranks to ``N_f = T N`` elements whose
smaller side is ``s``, under Megatron-LM's defaults (``--muon-tp-mode duplicated``,
``--muon-fp32-matmul-prec medium``, no Nesterov, QKV split):

- ``newton_schulz_tp``: ``x_shards`` (``T`` shards of ``4 N`` B) and ``global_x``
  (``torch.cat``, ``4 N_f`` B), both live while ``newton_schulz`` runs;
- ``newton_schulz``: ``F.normalize`` (``4 N_f``) beside ``.to(bfloat16)`` (``2 N_f``); per
  step ``X`` (``2 N_f``), ``A = X @ X.mT`` and ``B = addmm(A, A, A)`` (``2 s^2`` each) and
  the new ``X`` (``2 N_f``); the result beside ``.to(float32)`` (``6 N_f``);
- ``orth_grad * scale_factor * extra_scale_factor``: the gathered result (``4 N_f``) and
  two local products (``4 N`` each).

The tiny GPT (hidden 512, 8 heads, FFN 2048): QKV ``[1536, 512]``, projection
``[512, 512]``, fc1 ``[2048, 512]``, fc2 ``[512, 2048]``, position table ``[1024, 512]``.
"""

from __future__ import annotations

import pytest
from megatron_lm.tiny import SMALL, priced, step_of, tiny

from cpmem.errors import InputError
from cpmem.megatron.args import parse_megatron_args
from cpmem.pricing.muon_step import (
    newton_schulz_bytes,
    orthogonalize_bytes,
    split_qkv_bytes,
    step_transient_bytes,
)

H = 512


def test_newton_schulz_on_a_long_matrix_peaks_at_its_casts() -> None:
    # [1536, 512]: N = 786,432; casts 4N + 2N = 4,718,592; one step
    # 2N + 2 x 2 x 512^2 + 2N = 3,145,728 + 1,048,576 = 4,194,304
    assert newton_schulz_bytes(1536, 512) == 4_718_592


def test_newton_schulz_on_a_square_matrix_peaks_in_an_iteration() -> None:
    # [512, 512]: N = 262,144; casts 6N = 1,572,864; one step 4N + 4 x 512^2 = 2,097,152
    assert newton_schulz_bytes(512, 512) == 2_097_152


def test_one_column_parallel_matrix_gathered_over_two_ranks() -> None:
    # local [768, 512] split on rows over 2: gathered [1536, 512], N_f = 786,432:
    # shards and cat 8 N_f = 6,291,456 + Newton-Schulz 4,718,592 = 11,010,048;
    # the scale after: 4 N_f + 2 x 4 x 393,216 = 6,291,456
    assert orthogonalize_bytes(768, 512, 2, 0) == 11_010_048


def test_a_405b_fc1_gathered_over_tp_8() -> None:
    # Llama-3.1-405B's gated fc1, [2 x 53248, 16384], column-parallel over 8: N_f =
    # 1,744,830,464; s = 16384, 4 N_f + 4 s^2 < 6 N_f: 8 N_f + 6 N_f = 14 N_f
    # (22.75 GiB, docs/megatron-runtime.md); the scale after, 4 N_f + 8 N_f / 8, is smaller
    n_f = 2 * 53248 * 16384
    assert orthogonalize_bytes(2 * 53248 // 8, 16384, 8, 0) == 14 * n_f
    assert round(14 * n_f / 2**30, 1) == 22.8


def test_the_tiny_qkv_split_by_part_at_tp_2() -> None:
    # 4 query groups on the rank, parts of 64 rows each: every part's reshape copies
    # (4 N = 4 x 393,216 = 1,572,864); a part, local [256, 512] gathered to [512, 512]:
    # 8 x 262,144 + max(6, 4 + 4) x 262,144 = 4,194,304; the value (last) part beside the
    # copies and the two results before it (2 x 4 x 131,072): 6,815,744
    assert split_qkv_bytes((64, 64, 64), 4, H, 2) == 6_815_744


def test_the_tiny_gpts_step_holds_its_mlp_matrices_orthogonalisation() -> None:
    # fc1 / fc2, N = 1,048,576 (s = 512): 8N + max(6N, 4N + 4 x 512^2 = 5N) = 14N
    # at TP 1 (their TP 2 shards gather to the same); the QKV priced whole, 14 x 786,432,
    # is smaller
    for tp in (1, 2):
        step = step_of(tiny(optimizer="muon", tensor_model_parallel_size=tp), world_size=2 * tp)
        assert step_transient_bytes(step.settings, 0) == 14 * 2048 * H


def test_adam_and_adapters_hold_no_newton_schulz() -> None:
    step = step_of(tiny())
    assert step_transient_bytes(step.settings, 0) == 0


def test_the_peak_stays_at_backward_for_a_sequence_of_1024() -> None:
    est = priced(tiny(optimizer="muon"))
    assert est.forward_backward_bytes is not None
    assert est.forward_backward_bytes > 14 * 2048 * H
    assert "optimizer_step_excess" not in (est.forward_backward_components or {})


def test_the_peak_moves_to_the_optimizer_step_when_the_activations_are_smaller() -> None:
    # 16 tokens: the forward+backward activations are below the step's 14,680,064 B
    est = priced(tiny(optimizer="muon", seq_length=16, micro_batch_size=1))
    fb = est.forward_backward_components or {}
    excess = fb["optimizer_step_excess"]
    assert est.forward_backward_bytes == 14 * 2048 * H
    assert sum(fb.values()) == est.forward_backward_bytes
    assert excess == 14 * 2048 * H - sum(b for n, b in fb.items() if n != "optimizer_step_excess")
    assert est.static is not None
    assert est.peak_bytes == est.static.total + 14 * 2048 * H
    assert est.estimate_bytes < 14 * 2048 * H  # the forward figure does not move


def test_each_pipeline_stage_takes_its_own_step() -> None:
    est = priced(
        tiny(optimizer="muon", seq_length=16, micro_batch_size=1, pipeline_model_parallel_size=2)
    )
    assert est.stage_forward_backward_bytes == (14 * 2048 * H, 14 * 2048 * H)


BASE = SMALL


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--muon-tp-mode", "blockwise"),
        ("--muon-tp-mode", "distributed"),
        ("--muon-fp32-matmul-prec", "high"),
        ("--muon-fp32-matmul-prec", "low"),
        ("--muon-nesterov", None),
        ("--muon-no-split-qkv", None),
    ],
)
def test_another_orthogonalisation_is_refused_under_muon_only(flag: str, value: object) -> None:
    with pytest.raises(InputError) as err:
        parse_megatron_args({**BASE, "--optimizer": "muon", flag: value})
    assert err.value.value.startswith(flag)
    assert "Newton-Schulz" in err.value.reason
    # Adam never reads it (optimizer_config.py muon_*)
    assert flag in parse_megatron_args({**BASE, flag: value}).ignored


@pytest.mark.parametrize(
    ("flag", "value"), [("--muon-tp-mode", "duplicated"), ("--muon-fp32-matmul-prec", "medium")]
)
def test_the_default_orthogonalisation_is_priced(flag: str, value: object) -> None:
    parse_megatron_args({**BASE, "--optimizer": "muon", flag: value})


def test_the_iterations_and_scales_change_no_tensor() -> None:
    flags = {
        "--muon-num-ns-steps": 8,
        "--muon-coefficient-type": "polar_express",
        "--muon-scale-mode": "unit_rms_norm",
        "--muon-extra-scale-factor": 0.2,
        "--muon-momentum": 0.95,
    }
    args = parse_megatron_args({**BASE, "--optimizer": "muon", **flags})
    plain = parse_megatron_args({**BASE, "--optimizer": "muon"})
    assert priced(args, world_size=1).peak_bytes == priced(plain, world_size=1).peak_bytes
