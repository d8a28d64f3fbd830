"""Transformer Engine's attention-backend rule, each part against its source line.

Line numbers are at TE v2.11 (``transformer_engine/pytorch/attention/dot_product_attention/
utils.py`` "utils.py", ``transformer_engine/common/fused_attn/fused_attn.cpp``
"fused_attn.cpp") unless a version is named; megatron-core lines are 0.16.1's.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from cpmem.errors import InputError
from cpmem.step.attention_backend import (
    CONTAINERS,
    CUDNN_VERSIONS,
    DEFAULT_CONTAINER,
    AttentionQuery,
    Container,
    select_attention_backend,
)
from cpmem.step.device import DEVICES

A100, H100, GB200, SM89, SM120 = (8, 0), (9, 0), (10, 0), (8, 9), (12, 0)
FA2 = (2, 7, 4)
FA2_ONLY = Container("fa2", (2, 11), (9, 15, 0), FA2)
NO_FLASH = Container("none", (2, 11), (9, 15, 0), None)
FA3_ONLY = Container("fa3", (2, 11), (9, 15, 0), None, True)
FA2_FA3 = Container("fa2+fa3", (2, 11), (9, 15, 0), FA2, True)


def query(cc: tuple[int, int] = H100, **kw: Any) -> AttentionQuery:
    base: dict[str, Any] = dict(
        num_attention_heads=32,
        num_query_groups=8,
        head_dim_qk=128,
        head_dim_v=128,
        max_seqlen_q=4096,
        max_seqlen_kv=4096,
    )
    base.update(kw)
    return AttentionQuery(cc, **base)


def pick(q: AttentionQuery, container: Container = FA2_ONLY) -> str | None:
    return select_attention_backend(q, container).backend


def deterministic(cc: tuple[int, int], **kw: Any) -> AttentionQuery:
    return query(cc, deterministic_mode=True, **kw)


# --- priority: utils.py:1133-1146 -------------------------------------------------------


@pytest.mark.parametrize(
    ("cc", "want"), [(A100, "flash"), (SM89, "flash"), (H100, "fused"), (GB200, "fused")]
)
def test_fused_is_preferred_over_flash_from_sm90_on_and_flash_first_below(
    cc: tuple[int, int], want: str
) -> None:
    """utils.py:1133-1139: 'give FusedAttention preference on Hopper+' (cc >= (9, 0));
    below, flash is taken first (utils.py:1141-1146). Both are available in all four."""
    sel = select_attention_backend(query(cc), FA2_ONLY)
    assert sel.available == ("flash", "fused", "unfused")
    assert sel.backend == want


def test_flash_attention_3_is_preferred_over_flash_attention_2() -> None:
    """utils.py:1114-1117: flash_attention_backend becomes FA3's version when both are on;
    FA3 is sm90 only (utils.py:430-433)."""
    q = query(H100, attention_backend="flash")
    assert select_attention_backend(q, FA2_FA3).flash_version == 3
    assert select_attention_backend(q, FA2_ONLY).flash_version == 2
    assert (
        select_attention_backend(query(A100, attention_backend="flash"), FA2_FA3).flash_version == 2
    )


def test_unfused_is_last() -> None:
    """utils.py:1141-1146: unfused runs only where neither flash nor fused is left."""
    assert pick(query(H100)) == "fused"
    assert (
        pick(query(H100, env={"NVTE_FUSED_ATTN": "0"}, attention_backend=None), NO_FLASH)
        == "unfused"
    )


# --- environment: utils.py:407-412, language_module.py:92-126 -----------------------------


def test_nvte_flash_attn_0_turns_flash_off_for_te_used_directly() -> None:
    """utils.py:407-409: NVTE_FLASH_ATTN=0 turns flash 2 and 3 off; on sm80 fused runs."""
    q = query(A100, attention_backend=None, env={"NVTE_FLASH_ATTN": "0"})
    sel = select_attention_backend(q, FA2_ONLY)
    assert sel.backend == "fused"
    assert "flash" not in sel.available
    assert any(r.startswith("flash2: NVTE_FLASH_ATTN=0") for r in sel.reasons)


def test_megatron_auto_asserts_the_three_variables_are_unset_or_1() -> None:
    """language_module.py:102 and 124-126: under auto, NVTE_FLASH_ATTN=0 fails the assertion."""
    with pytest.raises(InputError, match="NVTE_FLASH_ATTN"):
        query(A100, env={"NVTE_FLASH_ATTN": "0"})
    assert pick(query(A100, env={"NVTE_FLASH_ATTN": "1"})) == "flash"


@pytest.mark.parametrize("backend", ["flash", "fused", "unfused"])
def test_an_explicit_megatron_backend_is_the_only_one_te_may_run(backend: str) -> None:
    """language_module.py:111-122: --attention-backend X sets the other two variables to 0."""
    sel = select_attention_backend(query(A100, attention_backend=backend), FA2_ONLY)
    assert sel.backend == backend
    assert sel.spread == (backend,)
    assert set(sel.refused) == {"flash", "fused", "unfused"} - {backend}


def test_an_explicit_fused_backend_fails_where_te_disables_fused() -> None:
    """A deterministic sm80 run under --attention-backend fused: fused is off
    (utils.py:1055-1066) and the other two are off by the environment: no backend left
    (dot_product_attention.py:1395-1401)."""
    sel = select_attention_backend(deterministic(A100, attention_backend="fused"), FA2_ONLY)
    assert sel.backend is None
    assert len(sel.no_backend_in) == len(CONTAINERS)


# --- context parallelism: utils.py:744-806 -------------------------------------------------


@pytest.mark.parametrize("comm", ["p2p", "a2a", "all_gather", "a2a+p2p"])
def test_unfused_is_refused_under_context_parallelism(comm: str) -> None:
    """utils.py:756-760: 'UnfusedDotProductAttention ... does not support context parallelism'."""
    sel = select_attention_backend(query(H100, context_parallel_size=2, cp_comm_type=comm))
    assert "unfused" in sel.refused
    assert "unfused" not in select_attention_backend(query(H100)).refused
    assert sel.backend == "fused"


def test_deterministic_cp_on_sm80_needs_flash_attention_installed() -> None:
    """Fused off for determinism below sm90 (utils.py:1055-1066), unfused off under CP
    (utils.py:756-760): without flash-attn no backend is left."""
    q = deterministic(A100, context_parallel_size=2)
    assert pick(q, FA2_ONLY) == "flash"
    assert pick(q, NO_FLASH) is None
    assert select_attention_backend(q).refused == ("fused", "unfused")


# --- head dimensions: utils.py:594-673, fused_attn.cpp:302-329 ---------------------------


def test_a_head_dim_above_256_leaves_only_unfused() -> None:
    """utils.py:620-638 (flash 2: head_dim_qk <= 256), utils.py:642 (flash 3: <= 256),
    fused_attn.cpp:304-311 (fused: <= 128, or <= 256 on sm90 with cuDNN 9.5+)."""
    for cc in (A100, H100, GB200):
        sel = select_attention_backend(query(cc, head_dim_qk=288, head_dim_v=288), FA2_FA3)
        assert sel.backend == "unfused"
        assert sel.refused == ("flash", "fused")


def test_a_head_dim_of_256_runs_flash_on_sm80_and_fused_on_sm90() -> None:
    """fused_attn.cpp:306-311: d <= 256 only on sm90 with cuDNN >= 9.5 in training;
    flash 2 takes d up to 256 on sm80 (utils.py:620-626)."""
    assert pick(query(A100, head_dim_qk=256, head_dim_v=256)) == "flash"
    assert pick(query(H100, head_dim_qk=256, head_dim_v=256)) == "fused"
    old = Container("cudnn-9.4", (2, 11), (9, 4, 0), None)
    sel = select_attention_backend(query(H100, head_dim_qk=256, head_dim_v=256), old)
    assert sel.backend == "unfused"
    assert any("fused_attn.cpp:302-329" in r for r in sel.reasons)


def test_flash_2_takes_a_head_dim_above_192_only_on_sm80_90_100_120() -> None:
    """utils.py:620-626: head_dim_qk > 192 needs sm80/90/100/120; sm89 has no fused
    support above 128 either (fused_attn.cpp:306)."""
    assert pick(query(SM89, head_dim_qk=224, head_dim_v=224)) == "unfused"
    assert pick(query(SM89, head_dim_qk=192, head_dim_v=192)) == "flash"


def test_flash_2_does_not_run_mla_head_dims() -> None:
    """utils.py:594-597: head_dim_qk != head_dim_v turns flash 2 off (on sm80 fused runs)."""
    sel = select_attention_backend(query(A100, head_dim_qk=128, head_dim_v=64), FA2_ONLY)
    assert sel.backend == "fused"
    assert "flash" not in sel.available


# --- dropout: utils.py:694-697, 876-888 ----------------------------------------------------


def test_dropout_turns_flash_attention_3_off() -> None:
    """utils.py:694-697: 'Disabling FlashAttention 3 for dropout'; with only FA3 and
    --attention-backend flash nothing is left."""
    assert (
        select_attention_backend(query(H100, attention_backend="flash"), FA3_ONLY).flash_version
        == 3
    )
    q = query(H100, attention_backend="flash", attention_dropout=0.1)
    assert pick(q, FA3_ONLY) is None
    assert select_attention_backend(q, FA2_FA3).flash_version == 2


@pytest.mark.parametrize("cc", [A100, H100, GB200])
def test_dropout_keeps_fused_for_a_causal_mask_without_a_window(cc: tuple[int, int]) -> None:
    """fused_attn.cpp:345-352 and 378-380: causal masks take any dropout; the Python side
    checks dropout only with a sliding window (utils.py:876-888)."""
    sel = select_attention_backend(query(cc, attention_dropout=0.1), FA2_ONLY)
    assert "fused" in sel.available


def test_a_sliding_window_with_dropout_turns_fused_off() -> None:
    """utils.py:883-888: fused supports (left, 0) windows only without dropout."""
    assert pick(query(H100, window_size=(128, 0))) == "fused"
    sel = select_attention_backend(query(H100, window_size=(128, 0), attention_dropout=0.1))
    assert sel.backend == "flash"
    assert any("utils.py:876-888" in r for r in sel.reasons)


# --- determinism: utils.py:1028-1070, dot_product_attention.py:395-398 -------------------


def test_determinism_turns_fused_off_below_sm90() -> None:
    """utils.py:1055-1066: F16_arbitrary_seqlen in training is not deterministic below sm90."""
    assert pick(deterministic(A100)) == "flash"
    assert pick(deterministic(A100), NO_FLASH) == "unfused"
    assert pick(query(A100), NO_FLASH) == "fused"


def test_determinism_keeps_fused_on_sm90() -> None:
    assert pick(deterministic(H100), NO_FLASH) == "fused"


def test_determinism_turns_fused_off_on_blackwell() -> None:
    """utils.py:1067-1070: 'Disabling FusedAttention for determinism reasons on Blackwell'."""
    assert pick(deterministic(GB200)) == "flash"
    assert pick(deterministic(GB200), NO_FLASH) == "unfused"
    assert pick(query(GB200), NO_FLASH) == "fused"


def test_determinism_needs_flash_attention_2_4_1() -> None:
    """utils.py:1040-1049: flash-attn below 2.4.1 is not deterministic."""
    old = Container("fa-2.4.0", (2, 11), (9, 15, 0), (2, 4, 0))
    assert pick(query(A100), old) == "flash"
    assert pick(deterministic(A100), old) == "unfused"


def test_deterministic_comes_from_the_variable_or_megatrons_flag() -> None:
    """dot_product_attention.py:395-398 reads NVTE_ALLOW_NONDETERMINISTIC_ALGO; at the
    snapshot --deterministic-mode sets it to 0 (determinism.py:29) and asserts any given
    value is 0 (determinism.py:61)."""
    assert query(A100, env={"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"}).deterministic
    assert query(A100, deterministic_mode=True).deterministic
    assert not query(A100, env={"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "1"}).deterministic
    with pytest.raises(InputError, match="NVTE_ALLOW_NONDETERMINISTIC_ALGO"):
        query(A100, deterministic_mode=True, env={"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "1"})


# --- flash-attn versions: backends.py:91-100, utils.py:116-118 ---------------------------


def test_blackwell_needs_flash_attention_2_7_3() -> None:
    """backends.py:96-98 with utils.py:117: on sm100+ flash-attn 2 below 2.7.3 counts as not installed."""
    old = Container("fa-2.6.3", (2, 11), (9, 15, 0), (2, 6, 3))
    assert pick(deterministic(A100), old) == "flash"
    assert pick(deterministic(GB200), old) == "unfused"
    assert (
        pick(deterministic(GB200), Container("fa-2.7.3", (2, 11), (9, 15, 0), (2, 7, 3))) == "flash"
    )


def test_te_2_9_accepts_flash_attention_up_to_2_8_1() -> None:
    """utils.py:118: max_version 2.8.1 at v2.9, 2.8.3 at v2.10 and v2.11."""
    fa = (2, 8, 3)
    assert pick(deterministic(A100), Container("a", (2, 9), (9, 15, 0), fa)) == "unfused"
    assert pick(deterministic(A100), Container("b", (2, 10), (9, 15, 0), fa)) == "flash"
    assert pick(deterministic(A100), Container("c", (2, 9), (9, 15, 0), (2, 8, 1))) == "flash"


# --- packed sequences (thd) ---------------------------------------------------------------


def packed(cc: tuple[int, int], **kw: Any) -> AttentionQuery:
    return query(cc, qkv_format="thd", attn_mask_type="padding_causal", **kw)


def test_unfused_runs_thd_from_te_2_11_only() -> None:
    """utils.py:659-662 at v2.9 and 679-682 at v2.10 turn unfused off for thd; v2.11 does
    not. On sm80 fused has no thd (fused_attn.cpp:393-402), so without flash-attn a
    packed run has a backend only under TE 2.11."""
    for te, want in (((2, 9), None), ((2, 10), None), ((2, 11), "unfused")):
        assert pick(packed(A100), Container("x", te, (9, 15, 0), None)) == want
    assert pick(packed(A100)) == "flash"
    assert pick(packed(H100), NO_FLASH) == "fused"


def test_padding_between_packed_sequences_turns_flash_off() -> None:
    """utils.py:676-685."""
    assert pick(packed(A100, pad_between_seqs=True), FA2_ONLY) == "unfused"


def test_megatron_passes_padding_causal_for_thd() -> None:
    """transformer_engine.py:1397-1402 turns causal into padding_causal for thd."""
    with pytest.raises(InputError, match="attn_mask_type"):
        query(H100, qkv_format="thd")
    with pytest.raises(InputError, match="attn_mask_type"):
        query(H100, attn_mask_type="padding_causal")


# --- cuDNN: fused_attn.cpp ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cudnn", "fused"), [((9, 10, 0), False), ((9, 10, 1), False), ((9, 10, 2), True)]
)
def test_cudnn_9_10_0_and_9_10_1_have_no_f16_fused_attention(
    cudnn: tuple[int, int, int], fused: bool
) -> None:
    """fused_attn.cpp:436-437: cudnn_runtime_version != 91000 and != 91001."""
    sel = select_attention_backend(query(H100), Container("x", (2, 11), cudnn, None))
    assert ("fused" in sel.available) is fused


def test_blackwell_fused_attention_needs_cudnn_9_7() -> None:
    """fused_attn.cpp:293-295: sm100 only with cuDNN >= 9.7."""
    assert pick(query(GB200), Container("x", (2, 11), (9, 6, 0), None)) == "unfused"
    assert pick(query(GB200), Container("x", (2, 11), (9, 7, 0), None)) == "fused"
    assert pick(query(H100), Container("x", (2, 11), (9, 6, 0), None)) == "fused"


def test_cudnn_9_14_0_refuses_a_non_causal_window_from_te_2_10() -> None:
    """fused_attn.cpp:478-486 (added in v2.10): cuDNN 9.14.0, s_kv > 1024, a window,
    a mask that is not causal: no backend."""
    q = packed(H100, window_size=(128, 0))
    for te, fused in (((2, 9), True), ((2, 10), False), ((2, 11), False)):
        sel = select_attention_backend(q, Container("x", te, (9, 14, 0), None))
        assert ("fused" in sel.available) is fused
    assert (
        "fused" in select_attention_backend(q, Container("x", (2, 11), (9, 15, 0), None)).available
    )


# --- other filters -----------------------------------------------------------------------------


def test_fp32_leaves_only_unfused() -> None:
    """utils.py:435-465: flash and fused need bf16/fp16."""
    sel = select_attention_backend(query(H100, dtype="fp32"), FA2_FA3)
    assert sel.backend == "unfused"
    assert sel.refused == ("flash", "fused")


def test_below_sm80_only_unfused_runs() -> None:
    """utils.py:422-429."""
    assert select_attention_backend(query((7, 0)), FA2_FA3).refused == ("flash", "fused")


def test_returning_the_max_logit_turns_flash_off() -> None:
    """utils.py:530-534 (megatron-core's --qk-clip sets return_max_logit,
    transformer_engine.py:1308-1314); v2.9 and v2.10 also turn fused off for thd
    (utils.py:515-517 at v2.9, 535-537 at v2.10)."""
    assert pick(query(A100, return_max_logit=True)) == "fused"
    q = packed(H100, return_max_logit=True)
    assert pick(q, Container("x", (2, 10), (9, 15, 0), FA2)) is None
    assert pick(q, Container("x", (2, 11), (9, 15, 0), FA2)) == "fused"


def test_a_non_vanilla_softmax_under_cp_runs_only_fused_with_a2a() -> None:
    """utils.py:708-742: flash off for any non-vanilla softmax; under CP unfused off, and
    fused off unless cp_comm_type is a2a."""
    base = dict(softmax_type="off-by-one", context_parallel_size=2)
    assert pick(query(H100, cp_comm_type="a2a", **base)) == "fused"
    assert pick(query(H100, cp_comm_type="p2p", **base)) is None


# --- the spread and the default container -------------------------------------------------


def test_the_spread_names_every_backend_some_container_picks() -> None:
    """A deterministic sm80 run: flash where flash-attn 2 is installed, unfused where not."""
    sel = select_attention_backend(deterministic(A100))
    assert sel.spread == ("flash", "unfused")
    assert sel.refused == ("fused",)
    assert select_attention_backend(query(H100, attention_dropout=0.1)).spread == ("fused",)


@pytest.mark.parametrize("cc", [A100, H100, GB200])
@pytest.mark.parametrize("det", [False, True])
@pytest.mark.parametrize("cp", [1, 2])
def test_the_default_containers_pick_is_in_the_spread(
    cc: tuple[int, int], det: bool, cp: int
) -> None:
    sel = select_attention_backend(query(cc, deterministic_mode=det, context_parallel_size=cp))
    assert DEFAULT_CONTAINER in CONTAINERS
    assert sel.backend in sel.spread


def test_the_container_set_is_te_2_9_to_2_11_by_cudnn_by_flash_attention() -> None:
    assert len(CONTAINERS) == len(set(CONTAINERS)) == 75
    assert {c.te for c in CONTAINERS} == {(2, 9), (2, 10), (2, 11)}
    with pytest.raises(InputError, match=r"container\.te"):
        Container("x", (2, 12), (9, 15, 0))


def test_every_reason_names_its_source_line() -> None:
    sel = select_attention_backend(deterministic(A100, context_parallel_size=2), NO_FLASH)
    assert len(sel.reasons) == 4  # flash 2, flash 3, fused, unfused
    for reason in sel.reasons:
        assert re.search(r"(utils|backends|fused_attn)\.(py|cpp):\d+", reason), reason


def test_bad_input_names_the_field() -> None:
    for kw, name in (
        ({"dtype": "fp8"}, "dtype"),
        ({"num_query_groups": 5}, "num_query_groups"),
        ({"tensor_parallel_size": 16}, "tensor_parallel_size"),
        ({"attention_dropout": 1.0}, "attention_dropout"),
        ({"cp_comm_type": "ring"}, "cp_comm_type"),
        ({"attention_backend": "local"}, "attention_backend"),
        ({"window_size": (-1, 4)}, "window_size"),
        ({"max_seqlen_q": 0}, "max_seqlen_q"),
    ):
        with pytest.raises(InputError) as exc:
            query(H100, **kw)
        assert exc.value.field == name


def test_heads_are_seen_per_tensor_parallel_rank() -> None:
    """dot_product_attention.py:1050-1051: TE reads heads from the local tensors."""
    q = query(H100, tensor_parallel_size=4)
    assert (q.num_heads, q.num_gqa_groups) == (8, 2)


# --- the device presets' compute capability -----------------------------------------------


@pytest.mark.parametrize(
    "name", [n for n, d in DEVICES.items() if d.compute_capability_major is not None]
)
def test_each_preset_carries_the_compute_capability_its_source_names(name: str) -> None:
    device = DEVICES[name]
    m = re.search(r"compute capability (\d+)\.(\d+)", device.source)
    assert m is not None
    assert device.compute_capability == (int(m.group(1)), int(m.group(2)))


@pytest.mark.parametrize("cc", [A100, H100, GB200])
@pytest.mark.parametrize("det", [False, True])
@pytest.mark.parametrize("thd", [False, True])
def test_every_cudnn_of_the_set_picks_as_the_default_for_causal_training(
    cc: tuple[int, int], det: bool, thd: bool
) -> None:
    """What DEFAULT_CONTAINER's source says of its unread cuDNN version: without a window,
    every cuDNN in CUDNN_VERSIONS passes the same clauses of fused_attn.cpp:290-445."""
    fmt: dict[str, Any] = {"qkv_format": "thd", "attn_mask_type": "padding_causal"} if thd else {}
    for d in (64, 128, 256):
        for cp in (1, 2):
            q = query(
                cc,
                head_dim_qk=d,
                head_dim_v=d,
                deterministic_mode=det,
                context_parallel_size=cp,
                attention_dropout=0.1,
                **fmt,
            )
            picks = {
                pick(q, Container("x", (2, 11), cudnn, DEFAULT_CONTAINER.flash_attn_2))
                for cudnn in CUDNN_VERSIONS
            }
            assert picks == {pick(q, DEFAULT_CONTAINER)}, (d, cp)
