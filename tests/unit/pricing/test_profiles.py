"""Learned-profile floors raise, never lower, and are trusted up to 8x token growth."""

from __future__ import annotations

import json

import pytest

from cpmem.api import describe_step, estimate, record_profile
from cpmem.errors import InputError
from cpmem.step.profiles import ProfileSignature, ProfileStore

SIG = ProfileSignature("qwen3.5-4b", 1, 1, "selective", "core_attn", False)


def test_floor_raises_never_lowers():
    plain = estimate("qwen3.5-4b", [1024])
    store = ProfileStore()
    store.observe(SIG, peak_bytes=1, tokens=1024)  # tiny: must not lower
    assert estimate("qwen3.5-4b", [1024], profiles=store).estimate_bytes == plain.estimate_bytes
    store.observe(SIG, peak_bytes=plain.estimate_bytes * 2, tokens=1024)
    raised = estimate("qwen3.5-4b", [1024], profiles=store)
    assert raised.estimate_bytes > plain.estimate_bytes
    assert raised.components["profile_floor"] > 0


def test_trusted_only_up_to_8x():
    store = ProfileStore()
    store.observe(SIG, peak_bytes=10**12, tokens=100)
    assert store.floor(SIG, 800) > 0
    assert store.floor(SIG, 801) == 0


def test_round_trip_and_errors(tmp_path):
    store = ProfileStore()
    store.observe(SIG, 5000, 10)
    path = tmp_path / "p.json"
    store.save(path)
    again = ProfileStore.load(path)
    assert again.floor(SIG, 10) == 5000
    path.write_text(json.dumps({SIG.key: {"tokens": 3}}))
    with pytest.raises(InputError, match="bytes_per_token"):
        ProfileStore.load(path)
    # a key without the whole step (a store keyed on the model, layout and recompute
    # alone) would floor steps it was never observed for: refused, by name
    path.write_text(json.dumps({"qwen3.5-4b|tp1|cp2|selective|core_attn|eager": {}}))
    with pytest.raises(InputError, match="not a step's key") as err:
        ProfileStore.load(path)
    assert "qwen3.5-4b|tp1|cp2" in err.value.field
    with pytest.raises(InputError, match="tokens=0"):
        store.observe(SIG, 1, 0)


def test_a_profile_floors_only_the_step_it_was_observed_for() -> None:
    """The key holds every setting that changes what a step's activations hold: a floor
    observed with the LM head, rank-1 adapters, all-gather CP, a steady step, does not
    raise the harness's step, another adapter rank, p2p where the policy prices it (CP
    4), or the first step; where the policy prices p2p as all-gather (the reference at
    CP 2, naming it ignored) the floor applies alike."""
    step = describe_step("qwen3.5-4b", [2048, 2048], cp=2)
    store = ProfileStore()
    store.observe(step.signature, peak_bytes=10**12, tokens=2048)
    assert estimate("qwen3.5-4b", [2048, 2048], cp=2, profiles=store).components["profile_floor"]
    for other in (
        {"head": "hidden"},
        {"lora_rank": 16},
        {"step": "first"},
        {"recompute": "full"},
        {"lora_dropout": 0.1},
    ):
        est = estimate("qwen3.5-4b", [2048, 2048], cp=2, profiles=store, **other)  # type: ignore[arg-type]
        assert est.components["profile_floor"] == 0, other
    p2p = estimate("qwen3.5-4b", [2048, 2048], cp=2, profiles=store, cp_comm="p2p")
    assert p2p.components["profile_floor"] and "cp_comm" in p2p.to_dict()["ignored_options"]
    wide = describe_step("qwen3.5-4b", [2048] * 4, cp=4)
    store.observe(wide.signature, peak_bytes=10**12, tokens=2048)
    assert estimate("qwen3.5-4b", [2048] * 4, cp=4, profiles=store).components["profile_floor"]
    ring = estimate("qwen3.5-4b", [2048] * 4, cp=4, profiles=store, cp_comm="p2p")
    assert ring.components["profile_floor"] == 0


def test_a_pipeline_chunk_gets_the_floor_scaled_to_its_layers() -> None:
    """A profile of the whole model's step is what its 32 layers held: a stage of 8 of
    them is floored at a quarter of it, not at the whole model's figure."""
    step = describe_step("qwen3.5-4b", [4096], head="hidden")
    store = ProfileStore()
    per_token = 10**8  # far above anything the layers hold: the floor decides
    store.observe(step.signature, peak_bytes=per_token * 4096, tokens=4096)
    whole = estimate("qwen3.5-4b", [4096], head="hidden", profiles=store)
    staged = estimate("qwen3.5-4b", [4096], head="hidden", profiles=store, pp=4, microbatches=1)
    floor_whole = whole.components["profile_floor"]
    floor_stage = staged.components["profile_floor"]
    assert floor_whole > 0 and floor_stage > 0
    # the floor raises the chunk to a quarter of the whole model's observed peak
    assert floor_stage == pytest.approx(floor_whole / 4, rel=0.02)


def test_record_profile_writes_what_estimate_reads(tmp_path) -> None:
    path = tmp_path / "prof.json"
    signature, tokens = record_profile(path, 4 * 10**10, "qwen3.5-4b", [2048, 2048], cp=2)
    assert tokens == 2048  # the busiest rank's
    assert json.loads(path.read_text()) == {
        signature.key: {"bytes_per_token": 4 * 10**10 / 2048, "tokens": 2048}
    }
    est = estimate("qwen3.5-4b", [2048, 2048], cp=2, profiles=path)
    assert est.components["profile_floor"] > 0
    with pytest.raises(InputError) as err:
        record_profile(path, 10**9, "qwen3.5-4b", [4096], pp=2)
    assert err.value.field == "pp"
    with pytest.raises(InputError) as err:
        record_profile(path, -1, "qwen3.5-4b", [4096])
    assert err.value.field == "peak_bytes"


def test_the_key_fields_a_policy_may_ignore_are_options_it_may_ignore() -> None:
    """Each option whose fields a lookup may blank is one a policy may leave unpriced
    (``registry.SETTABLE``), and each of its fields is a field of the key."""
    from cpmem.pricing.registry import SETTABLE
    from cpmem.step.profiles import KEY_ORDER, OPTION_FIELDS

    assert set(OPTION_FIELDS) <= set(SETTABLE)
    assert {f for fields in OPTION_FIELDS.values() for f in fields} <= set(KEY_ORDER)
