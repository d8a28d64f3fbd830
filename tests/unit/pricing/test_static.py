"""Static memory, the device presets and the budget rule, held to the facts behind them.

Expected figures come from published parameter counts, Megatron-LM's
distributed-optimizer table, the measured cells in golden/ and arithmetic written out
here, never from the module under test.
"""

from __future__ import annotations

import pytest

from cpmem.api import estimate
from cpmem.errors import InputError
from cpmem.golden.cells import load_cells
from cpmem.golden.files import CELLS_FILE, default_golden_dir
from cpmem.model.presets import get_preset
from cpmem.plan.layout import ParallelLayout
from cpmem.pricing.device_budget import NON_TORCH_BYTES, RESERVE_FRACTION, device_budget
from cpmem.pricing.static import StaticMemory, adapter_parameters, static_memory
from cpmem.pricing.weights import padded_vocab, rank_weights, total_parameters
from cpmem.pricing.workspaces import CUBLAS_DEFAULT_HOPPER, TE_WORKSPACE_HOPPER
from cpmem.step.describe import describe_settings
from cpmem.step.device import DEVICES, Device, resolve_device
from cpmem.step.trainer import Adapter

CELLS = load_cells(default_golden_dir() / CELLS_FILE)


def test_parameter_counts_match_the_model_cards() -> None:
    """Qwen3-1.7B's card: 1.7B parameters, 1.4B without the (tied) embedding;
    Qwen3.5-35B-A3B: 35B; Qwen3.5-27B: 27B (text model, without the checkpoint's MTP
    layer: with it the 35B-A3B counts 35.5B)."""
    small = get_preset("qwen3-1.7b")
    assert round(total_parameters(small) / 1e9, 1) == 1.7
    assert round((total_parameters(small) - small.vocab * small.hidden) / 1e9, 1) == 1.4
    assert round(total_parameters(get_preset("qwen3.5-35b-a3b"), mtp=False) / 1e9) == 35
    assert round(total_parameters(get_preset("qwen3.5-27b"), mtp=False) / 1e9) == 27


def test_tied_embeddings_hold_one_vocabulary_matrix() -> None:
    g = get_preset("qwen3.5-4b")  # tied
    w = rank_weights(g, ParallelLayout(tp=2, sp=True))
    assert w.output_layer == 0
    assert w.embedding == padded_vocab(g, 2) // 2 * g.hidden * 2
    untied = rank_weights(get_preset("qwen3.5-27b"), ParallelLayout(tp=2, sp=True))
    assert untied.output_layer == untied.embedding > 0


def test_the_vocabulary_is_padded_to_128_times_tp() -> None:
    """megatron's make_vocab_size_divisible_by = 128: 151,936 = 128 x 1,187 stays at TP1
    and pads to 152,064 = 256 x 594 at TP2."""
    g = get_preset("qwen3-1.7b")
    assert padded_vocab(g, 1) == 151_936
    assert padded_vocab(g, 2) == 152_064


def test_weights_shard_over_tp_except_the_replicated_parts() -> None:
    """Doubling TP halves every sharded byte: what is left at TP2 - 2 x TP4 is what
    every rank holds whole (norms), a few hundred kB on Qwen3.5-27B, not a fraction."""
    g = get_preset("qwen3.5-27b")
    tp2 = rank_weights(g, ParallelLayout(tp=2, sp=True)).layers
    tp4 = rank_weights(g, ParallelLayout(tp=4, sp=True)).layers
    replicated = 2 * tp4 - tp2
    norms = (g.layers * 2 * g.hidden + g.attention_layers * 2 * g.head_dim) * 2
    norms += g.gdn_layers * g.gdn_value_dim * 2
    assert replicated == norms


def _bytes_per_trainable(**settings: object) -> float:
    """Static bytes per adapter parameter beyond the frozen base (rank 64 adapters)."""
    one = describe_settings("qwen3.5-4b", lora_rank=64, step="steady", **settings)  # type: ignore[arg-type]
    trainable = adapter_parameters(one.geometry, one.adapter, one.layout)
    s = static_memory(one)
    workspaces = s.components["cublas_workspaces"] + s.components["te_cublaslt_workspace"]
    base = s.components["base_weights"] + workspaces
    return (s.total - base) / trainable


def test_adam_holds_megatrons_18_bytes_per_parameter() -> None:
    """Megatron-LM's distributed-optimizer guide: bf16 params with fp32 grads hold 18 B
    per parameter with Adam, 6 + 12/d with the distributed optimizer."""
    assert _bytes_per_trainable() == 18
    assert _bytes_per_trainable(dp=4, distributed_optimizer=True) == pytest.approx(6 + 12 / 4)
    assert _bytes_per_trainable(dp=4) == 18  # without it, DP replicates the states
    # megatron-core shards the states over DP x CP (intra_dp_cp_group), CP ranks holding
    # the same parameters as data-parallel ones
    assert _bytes_per_trainable(dp=2, cp=2, distributed_optimizer=True) == pytest.approx(6 + 12 / 4)
    assert _bytes_per_trainable(cp=2) == 18
    assert _bytes_per_trainable(optimizer="sgd") == 2 + 4 + 4 + 4  # momentum, not two moments
    assert _bytes_per_trainable(optimizer="none") == 2


def test_moments_appear_at_the_first_optimizer_step() -> None:
    """Adam's moments are made at the first step: a cold step (the first of its process)
    holds the master copy but not the moments."""
    settings = describe_settings("qwen3.5-4b", lora_rank=64, step="first")
    trainable = adapter_parameters(settings.geometry, settings.adapter, settings.layout)
    cold, warm = static_memory(settings), static_memory(settings, stepped=True)
    moments = warm.components["optimizer_states"] - cold.components["optimizer_states"]
    assert moments == 8 * trainable
    assert "cublas_workspaces" not in cold.components  # a cold step's set-up is its own


def test_adapter_parameters_grow_with_rank_and_targets() -> None:
    g, layout = get_preset("qwen3.5-4b"), ParallelLayout(tp=2, sp=True)
    r1 = adapter_parameters(g, Adapter(1), layout)
    assert adapter_parameters(g, Adapter(16), layout) == 16 * r1
    attention = adapter_parameters(g, Adapter(16, targets=("qkv", "proj")), layout)
    assert 0 < attention < 16 * r1


def test_warm_workspaces_are_what_every_first_cell_gained_after_its_first_step() -> None:
    """Every dense process's first cell gains 96 MiB + 1 KiB between its first and
    second repetition: two of PyTorch's 32 MiB cuBLAS workspaces (the forward's thread and
    autograd's) and Transformer Engine's 32 MiB + 1 KiB on the H200; the Qwen3-1.7B
    processes up to 3.4 MiB more (their baselines also grow with the tokens they have
    run, 0.1-14 MiB, which no static term prices)."""
    settings = describe_settings("qwen3.5-4b", tp=2, step="steady", device="h200")
    s = static_memory(settings)
    warm = s.components["cublas_workspaces"] + s.components["te_cublaslt_workspace"]
    assert warm == 2 * CUBLAS_DEFAULT_HOPPER + TE_WORKSPACE_HOPPER == 96 * 2**20 + 2**10
    gains = {
        c.baseline_max_bytes - c.baseline_min_bytes
        for c in CELLS
        if c.baseline_min_bytes is not None
        and c.baseline_max_bytes is not None
        and c.ep == 1
        and c.baseline_max_bytes - c.baseline_min_bytes > 50 * 2**20
    }
    assert min(gains) == warm, gains
    assert all(warm <= g <= warm + 4 * 2**20 for g in gains), gains


def test_non_torch_bytes_are_what_the_first_process_left_unaccounted() -> None:
    """total - 3% - (available + baseline) of the Qwen3-1.7B TP2 cells, on the H200."""
    h200 = DEVICES["h200"].total_bytes
    left = {
        h200 - int(RESERVE_FRACTION * h200) - (c.available_bytes + c.baseline_max_bytes)
        for c in CELLS
        if c.model == "Qwen/Qwen3-1.7B"
        and c.tp == 2
        and c.available_bytes is not None
        and c.baseline_max_bytes is not None
    }
    assert NON_TORCH_BYTES in left
    assert max(left) - min(left) < 1e6  # one process, one figure


def test_the_seed_pair_budget_is_within_3_percent_of_what_the_runtime_computed() -> None:
    """Qwen3.5-27B at TP1 CP2 on an H200: the recorded budget 87,905,317,069 B."""
    [seed] = [c for c in CELLS if c.cell_id == "cp:27b-selective:4096+4096"]
    assert seed.available_bytes == 87_905_317_069
    est = estimate("qwen3.5-27b", [4096, 4096], shared_prefix=1228, cp=2, device="h200")
    assert est.device_budget is not None
    assert abs(est.device_budget.budget_bytes / seed.available_bytes - 1) < 0.03


def test_the_budget_is_the_total_less_reserve_outside_torch_and_static() -> None:
    device = Device("test", 100_000_000_000)
    static = StaticMemory({"base_weights": 10_000_000_000})
    b = device_budget(device, static)
    assert b.budget_bytes == 100_000_000_000 - 3_000_000_000 - NON_TORCH_BYTES - 10_000_000_000
    assert device_budget(device, StaticMemory({"base_weights": 10**12})).budget_bytes == 0


def test_device_presets_resolve_by_name_and_runtime_name() -> None:
    assert resolve_device("H200") is DEVICES["h200"]
    assert resolve_device("NVIDIA H200") is DEVICES["h200"]  # the golden cells' device
    assert resolve_device(None, 80_000_000_000) == Device("custom", 80_000_000_000)
    assert resolve_device(None) is None
    # every preset is a real device's figure: below its marketed capacity, above 90% of it
    marketed = {"a100-80gb": 80, "h100": 80, "h200": 141, "b200": 192, "mi300x": 192}
    for name, gb in marketed.items():
        total = DEVICES[name].total_bytes
        assert 0.9 * gb * 1e9 < total <= gb * 1e9 * 1.075, name  # GiB-rounded HBM stacks
        assert DEVICES[name].source


@pytest.mark.parametrize(
    ("device", "total", "field"),
    [
        ("h300", None, "device"),
        ("h200", 80_000_000_000, "device_total_bytes"),
        (None, 0, "device_total_bytes"),
        (None, -5, "device_total_bytes"),
    ],
)
def test_a_bad_device_names_its_field(device: str | None, total: int | None, field: str) -> None:
    with pytest.raises(InputError) as err:
        estimate("qwen3.5-4b", [2048], device=device, device_total_bytes=total)
    assert err.value.field == field


def test_bad_optimizer_settings_name_their_field() -> None:
    for kwargs, field in (
        ({"optimizer": "adamw"}, "optimizer"),
        ({"dp": 0}, "dp"),
        ({"distributed_optimizer": "yes"}, "distributed_optimizer"),
    ):
        with pytest.raises(InputError) as err:
            estimate("qwen3.5-4b", [2048], **kwargs)  # type: ignore[arg-type]
        assert err.value.field == field


def test_static_memory_does_not_move_any_activation_figure() -> None:
    """The whole-device inputs price the static memory only."""
    plain = estimate("qwen3.5-4b", [4096], cp=2)
    whole = estimate(
        "qwen3.5-4b",
        [4096],
        cp=2,
        device="h100",
        optimizer="sgd",
        dp=4,
        distributed_optimizer=True,
    )
    assert whole.estimate_bytes == plain.estimate_bytes
    assert whole.components == plain.components
    assert whole.static is not None and plain.static is not None
    assert whole.static.total < plain.static.total
