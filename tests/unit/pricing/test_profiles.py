"""Learned-profile floors raise, never lower, and are trusted up to 8x token growth."""

from __future__ import annotations

import json

import pytest

from cpmem.api import estimate
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
    path.write_text(json.dumps({"k": {"tokens": 3}}))
    with pytest.raises(InputError, match="bytes_per_token"):
        ProfileStore.load(path)
    with pytest.raises(InputError, match="tokens=0"):
        store.observe(SIG, 1, 0)
