"""Reading Megatron-LM's arguments: ``model_config.yaml`` and flags files, switches,
Megatron-LM's defaults, and the three flag tables (priced, ignored, refused).

Expected values: Megatron-LM's own source at the recordings' snapshot (``d98e8a64``,
``megatron/training/arguments.py`` and ``megatron/core/transformer/
transformer_config.py``; the lines are cited where a default is checked) and the
functional tests' own ``model_config.yaml`` files kept in ``golden/megatron/cases``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from cpmem.errors import InputError
from cpmem.megatron.args import (
    FIELD_NAMES,
    IGNORED,
    IGNORED_REASONS,
    PRICED,
    REFUSED,
    MegatronArgs,
    parse_megatron_args,
    read_megatron_args,
)
from cpmem.megatron.ignored import IGNORED_GROUPS
from cpmem.megatron.refused import REFUSED_GROUPS
from cpmem.megatron.snapshot import arguments as snapshot_arguments
from megatron_lm.tiny import step_of as run_of

GOLDEN_CASES = Path(__file__).resolve().parents[3] / "golden" / "megatron" / "cases"
REQUIRED = {
    "--num-layers": 12,
    "--hidden-size": 512,
    "--num-attention-heads": 8,
    "--seq-length": 1024,
    "--max-position-embeddings": 1024,
    "--micro-batch-size": 4,
}


def _parse(**extra: Any) -> MegatronArgs:
    """The required flags plus ``extra`` (keyword ``disable_bias_linear`` is
    ``--disable-bias-linear``)."""
    flags: dict[str, object] = dict(REQUIRED)
    flags.update({"--" + k.replace("_", "-"): v for k, v in extra.items()})
    return parse_megatron_args(flags)


def _write_yaml(tmp_path: Path, model_args: dict[str, object], env: object = None) -> Path:
    doc: dict[str, object] = {"MODEL_ARGS": model_args, "TEST_TYPE": "regular"}
    if env is not None:
        doc["ENV_VARS"] = env
    path = tmp_path / "model_config.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


# --- reading the two file forms ---------------------------------------------------------


def test_a_model_config_yaml_gives_its_model_args_and_env(tmp_path: Path) -> None:
    path = _write_yaml(
        tmp_path,
        {
            **REQUIRED,
            "--tensor-model-parallel-size": 2,
            "--bf16": True,
            "--hidden-dropout": 0.0,
            "--log-interval": 1,
        },
        env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "CUDA_DEVICE_MAX_CONNECTIONS": 1},
    )
    args = read_megatron_args(path)
    assert (args.num_layers, args.hidden_size, args.num_attention_heads) == (12, 512, 8)
    assert (args.seq_length, args.max_position_embeddings, args.micro_batch_size) == (
        1024,
        1024,
        4,
    )
    assert args.tensor_model_parallel_size == 2
    assert args.bf16 is True
    assert args.hidden_dropout == 0.0
    # the environment is kept as text, as a shell exports it
    assert args.env == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert args.ignored == ("--log-interval",)
    assert "--bf16" in args.given and "--log-interval" not in args.given


def test_a_flags_file_with_its_launcher_continuations_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "run.sh"
    path.write_text(
        "# the tiny GPT\n"
        "python pretrain_gpt.py \\\n"
        "    --num-layers 12 --hidden-size 512 \\\n"
        "    --num-attention-heads 8 \\\n"
        "    # the sequence\n"
        "    --seq-length=2048 --max-position-embeddings 2048 \\\n"
        "    --micro-batch-size 2 --global-batch-size 16 \\\n"
        "    --bf16 --disable-bias-linear --hidden-dropout 0.05 \\\n"
        "    --save /tmp/ckpt\n",
        encoding="utf-8",
    )
    args = read_megatron_args(path)
    assert (args.num_layers, args.hidden_size, args.num_attention_heads) == (12, 512, 8)
    assert (args.seq_length, args.max_position_embeddings) == (2048, 2048)
    assert (args.micro_batch_size, args.global_batch_size) == (2, 16)
    assert args.bf16 is True and args.add_bias_linear is False
    assert args.hidden_dropout == 0.05
    assert args.ignored == ("--save",)
    assert args.env == {}


def test_a_value_with_no_flag_before_it_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "flags.txt"
    path.write_text("12 --num-layers 12", encoding="utf-8")
    with pytest.raises(InputError) as err:
        read_megatron_args(path)
    assert (err.value.field, err.value.value) == ("megatron_args", "12")


def test_a_switch_followed_by_a_value_in_a_flags_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "flags.txt"
    path.write_text("--num-layers 12 --bf16 stray", encoding="utf-8")
    with pytest.raises(InputError) as err:
        read_megatron_args(path)
    # named with the required flags the file lacks, in one refusal
    assert err.value.field == "megatron_args"
    assert str(err.value.value).startswith("--bf16 stray, --hidden-size")
    assert ": --bf16 stray: is a switch" in err.value.reason


def test_a_yaml_file_without_model_args_or_unreadable_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "model_config.yaml"
    path.write_text("ENV_VARS: {}\nTEST_TYPE: regular\n", encoding="utf-8")
    with pytest.raises(InputError) as err:
        read_megatron_args(path)
    assert err.value.field == "megatron_args" and "MODEL_ARGS" in err.value.reason
    with pytest.raises(InputError) as err:
        read_megatron_args(tmp_path / "absent.yaml")
    assert err.value.field == "megatron_args" and "cannot be read" in err.value.reason


# --- switches ---------------------------------------------------------------------------


def test_store_true_switches_turn_their_field_on() -> None:
    assert _parse().bf16 is False and _parse(bf16=True).bf16 is True
    assert _parse(swiglu=None).swiglu is True  # a switch alone in a flags file
    assert _parse(use_distributed_optimizer=True).use_distributed_optimizer is True


def test_store_false_switches_turn_their_field_off() -> None:
    # transformer_config.py:212: add_bias_linear=True, flag --disable-bias-linear
    assert _parse().add_bias_linear is True
    assert _parse(disable_bias_linear=True).add_bias_linear is False
    # arguments.py:2944: --no-gradient-accumulation-fusion, store_false
    assert _parse().gradient_accumulation_fusion is True
    assert _parse(no_gradient_accumulation_fusion=True).gradient_accumulation_fusion is False


def test_a_switch_set_false_in_yaml_is_not_passed() -> None:
    # a YAML ``--flag: false`` means the launcher leaves the flag out
    assert _parse(disable_bias_linear=False).add_bias_linear is True
    assert _parse(bf16=False).bf16 is False
    assert "--bf16" not in _parse(bf16=False).given


def test_recompute_activations_means_selective_recompute() -> None:
    # arguments.py:607-608: if args.recompute_activations: granularity = 'selective'
    assert _parse().recompute_granularity is None
    assert _parse(recompute_activations=True).recompute_granularity == "selective"


def test_recompute_activations_wins_whatever_the_flag_order() -> None:
    flags: dict[str, object] = {
        **REQUIRED,
        "--recompute-activations": True,
        "--recompute-granularity": "full",
    }
    assert parse_megatron_args(flags).recompute_granularity == "selective"
    # a method beside it is then selective recompute's, which Megatron-LM rejects
    # (arguments.py:1425-1428)
    with pytest.raises(InputError) as err:
        parse_megatron_args({**flags, "--recompute-method": "uniform"})
    assert err.value.value == "--recompute-method uniform"
    assert "not yet supported for selective" in err.value.reason


# --- Megatron-LM's defaults -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "megatron_default"),
    [
        # transformer_config.py:188: hidden_dropout: float = 0.1
        ("hidden_dropout", 0.1),
        # transformer_config.py:191: attention_dropout: float = 0.1
        ("attention_dropout", 0.1),
        # arguments.py:2441: --make-vocab-size-divisible-by, type=int, default=128
        ("make_vocab_size_divisible_by", 128),
        # transformer_config.py:256: normalization: Literal[...] = "LayerNorm"
        ("normalization", "LayerNorm"),
        # transformer_config.py:212-214: add_bias_linear: bool = field(default=True, ...)
        ("add_bias_linear", True),
        # arguments.py:2397: --position-embedding-type, default='learned_absolute'
        ("position_embedding_type", "learned_absolute"),
        # arguments.py:2460: --untie-embeddings-and-output-weights, action='store_true'
        ("untie_embeddings_and_output_weights", False),
        # transformer_config.py:151: attention_backend: AttnBackend = AttnBackend.auto
        ("attention_backend", "auto"),
        # arguments.py:3067: --attention-softmax-in-fp32, action='store_true'
        ("attention_softmax_in_fp32", False),
    ],
)
def test_an_argument_not_given_takes_megatron_lms_default(
    name: str, megatron_default: object
) -> None:
    assert getattr(_parse(), name) == megatron_default


# --- refused, unknown, ignored, required, types -----------------------------------------


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--fp4-format", "e2m1"),
        ("--moe-expert-rank-capacity-factor", 1.5),
        ("--muon-scalar-optimizer", "lion"),
    ],
)
def test_a_refused_flag_is_named_in_the_error(flag: str, value: object) -> None:
    assert flag in REFUSED
    with pytest.raises(InputError) as err:
        parse_megatron_args({**REQUIRED, flag: value})
    assert err.value.field == "megatron_args"
    assert err.value.value == f"{flag} {value}"
    assert REFUSED[flag] in err.value.reason
    assert "changes memory cpmem does not price" in err.value.reason


def test_a_refused_switch_is_named_without_a_value() -> None:
    with pytest.raises(InputError) as err:
        parse_megatron_args({**REQUIRED, "--fp32-residual-connection": True})
    assert (err.value.field, err.value.value) == ("megatron_args", "--fp32-residual-connection")


def test_a_distillation_teacher_is_refused_for_the_architecture_its_checkpoint_holds() -> None:
    # post_training/model_builder.py:49-80 at 4828d651: the teacher's layers, hidden size and
    # heads come from model_config.yaml in --export-kd-teacher-load's directory (or from
    # --export-kd-teacher-model-config), never from the student's arguments
    with pytest.raises(InputError) as err:
        parse_megatron_args({**REQUIRED, "--export-kd-teacher-load": "/ckpt/teacher"})
    assert err.value.value == "--export-kd-teacher-load /ckpt/teacher"
    assert "model_config.yaml in the teacher's checkpoint directory" in err.value.reason
    assert "ModelOpt's quantized" not in err.value.reason


def test_a_flag_the_snapshots_parser_lacks_is_refused() -> None:
    # --fp8 is not an argument at the snapshot (--fp8-format is); argparse rejects it
    assert "--fp8" not in snapshot_arguments() and "--fp8-format" in snapshot_arguments()
    with pytest.raises(InputError) as err:
        parse_megatron_args({**REQUIRED, "--fp8": True})
    assert (err.value.field, err.value.value) == ("megatron_args", "--fp8")
    assert "is not an argument of Megatron-LM's pretrain_gpt.py at d98e8a64" in err.value.reason


def test_a_refusal_names_every_unknown_and_refused_flag_at_once() -> None:
    with pytest.raises(InputError) as err:
        parse_megatron_args(
            {
                **REQUIRED,
                "--no-such-flag": 3,
                "--log-interval": 1,  # ignored: not named
                "--another-unknown": True,
                "--fp4-format": "e2m1",
            }
        )
    assert err.value.field == "megatron_args"
    assert err.value.value == "--no-such-flag 3, --another-unknown, --fp4-format e2m1"
    reason = err.value.reason
    assert reason.startswith("3 arguments are refused: ")
    # the two unknown flags share a reason: it is said once, after both
    assert ": --no-such-flag 3, --another-unknown: is not an argument" in reason
    assert reason.count("is not an argument") == 1
    assert f"; --fp4-format e2m1: {REFUSED['--fp4-format']}" in reason
    assert "--log-interval" not in reason


def test_a_refusal_names_the_broken_rules_beside_the_refused_flags() -> None:
    with pytest.raises(InputError) as err:
        parse_megatron_args({**REQUIRED, "--fp4-format": "e2m1", "--bf16": True, "--fp16": True})
    assert str(err.value.value) == "--fp4-format e2m1, --bf16 --fp16"
    assert "name two parameter dtypes" in err.value.reason


def test_a_missing_required_flag_is_named_with_the_others() -> None:
    flags = {k: v for k, v in REQUIRED.items() if k not in ("--num-layers", "--seq-length")}
    with pytest.raises(InputError) as err:
        parse_megatron_args({**flags, "--no-such-flag": 1})
    assert str(err.value.value) == "--no-such-flag 1, --num-layers, --seq-length"
    assert "is required (Megatron-LM has no default for it)" in err.value.reason


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        # refused as unknown before every flag was classified; each changes no device
        # tensor of the logged steps (ignored.py names why)
        ("--mock-data", True),
        ("--tiktoken-pattern", "v2"),
        ("--train-samples", 1000),
        ("--lr-warmup-iters", 10),
        ("--num-workers", 8),
        ("--profile", True),
        ("--no-load-optim", True),
        ("--tokenizer-model", "/data/tokenizer.model"),
    ],
)
def test_harmless_flags_are_ignored(flag: str, value: object) -> None:
    assert flag in IGNORED and flag in IGNORED_REASONS
    args = parse_megatron_args({**REQUIRED, flag: value})
    assert args.ignored == (flag,)
    assert args == parse_megatron_args(REQUIRED)


def test_a_refused_flag_at_its_snapshot_default_is_read_as_absent() -> None:
    # --exp-avg-dtype: choices fp32, fp16, bf16, fp8, default 'fp32' (its row)
    assert snapshot_arguments()["--exp-avg-dtype"].default == "fp32"
    args = parse_megatron_args({**REQUIRED, "--exp-avg-dtype": "fp32"})
    assert args.ignored == ("--exp-avg-dtype",)
    with pytest.raises(InputError) as err:
        parse_megatron_args({**REQUIRED, "--exp-avg-dtype": "bf16"})
    assert err.value.value == "--exp-avg-dtype bf16"


def test_a_refused_flag_at_a_harmless_value_is_read_as_absent() -> None:
    assert parse_megatron_args({**REQUIRED, "--rerun-mode": "disabled"}).ignored == (
        "--rerun-mode",
    )
    for flag, value in (("--optimizer", "sgd"), ("--rerun-mode", "report_determinism_stats")):
        with pytest.raises(InputError) as err:
            parse_megatron_args({**REQUIRED, flag: value})
        assert err.value.value == f"{flag} {value}"


def test_an_inference_or_rl_test_case_is_refused_by_its_mode(tmp_path: Path) -> None:
    for mode in ("inference", "rl"):
        path = _write_yaml(tmp_path, {**REQUIRED, "--temperature": 1.0})
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        doc["MODE"] = mode
        path.write_text(yaml.safe_dump(doc), encoding="utf-8")
        with pytest.raises(InputError) as err:
            read_megatron_args(path)
        assert err.value.value == f"MODE: {mode}"
        assert "not a pretrain_gpt.py training run" in err.value.reason


def test_ignored_flags_land_in_ignored_and_change_nothing_priced() -> None:
    plain = parse_megatron_args(REQUIRED)
    noisy = parse_megatron_args(
        {**REQUIRED, "--train-iters": 50, "--lr": 1.5e-4, "--log-interval": 1, "--save": "x"}
    )
    assert noisy.ignored == ("--log-interval", "--lr", "--save", "--train-iters")
    assert plain.ignored == ()
    assert noisy == plain  # the priced fields only (env, ignored, given: compare=False)


@pytest.mark.parametrize(
    "missing", ["--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length"]
)
def test_a_missing_required_flag_is_refused(missing: str) -> None:
    flags = {k: v for k, v in REQUIRED.items() if k != missing}
    with pytest.raises(InputError) as err:
        parse_megatron_args(flags)
    assert (err.value.field, err.value.value) == ("megatron_args", missing)


def test_a_missing_micro_batch_size_is_refused() -> None:
    flags = {k: v for k, v in REQUIRED.items() if k != "--micro-batch-size"}
    with pytest.raises(InputError) as err:
        parse_megatron_args(flags)
    assert err.value.value == "--micro-batch-size"


def test_a_missing_max_position_embeddings_is_refused() -> None:
    flags = {k: v for k, v in REQUIRED.items() if k != "--max-position-embeddings"}
    with pytest.raises(InputError):  # refused when read or when the run is described
        run_of(parse_megatron_args(flags))


def test_fewer_positions_than_the_sequence_are_refused() -> None:
    with pytest.raises(InputError):  # refused when read or when the run is described
        run_of(parse_megatron_args({**REQUIRED, "--max-position-embeddings": 512}))


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--num-layers", "twelve", "must be an integer"),
        ("--num-layers", 12.5, "must be an integer"),
        ("--num-layers", True, "must be an integer"),
        ("--hidden-dropout", "abc", "must be a number"),
        ("--bf16", "yes", "is a switch"),
        ("--seq-length", None, "needs a value"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused(flag: str, value: object, says: str) -> None:
    with pytest.raises(InputError) as err:
        parse_megatron_args({**REQUIRED, flag: value})
    assert err.value.field == "megatron_args" and flag in str(err.value.value)
    assert says in err.value.reason


def test_numbers_written_as_yaml_floats_or_text_are_read() -> None:
    args = _parse(num_layers=24.0, hidden_dropout="0.2", global_batch_size="64")
    assert (args.num_layers, args.hidden_dropout, args.global_batch_size) == (24, 0.2, 64)


# --- the tables against the real test cases ---------------------------------------------


def test_the_tables_are_disjoint_and_every_priced_field_exists() -> None:
    priced = set(PRICED)
    assert not priced & IGNORED and not priced & set(REFUSED) and not IGNORED & set(REFUSED)
    assert {name for name, _ in PRICED.values()} <= FIELD_NAMES


def test_every_snapshot_flag_is_in_exactly_one_table_and_every_entry_is_a_flag() -> None:
    snapshot = set(snapshot_arguments())
    assert len(snapshot) > 800  # the file was read whole (every group of the parser)
    tables = {"priced": set(PRICED), "ignored": set(IGNORED), "refused": set(REFUSED)}
    misplaced = {
        flag: [name for name, table in tables.items() if flag in table]
        for flag in snapshot
        if sum(flag in table for table in tables.values()) != 1
    }
    assert misplaced == {}
    assert set().union(*tables.values()) - snapshot == set()


def test_no_flag_is_named_by_two_groups() -> None:
    named = [f for _, flags in IGNORED_GROUPS + REFUSED_GROUPS for f in flags.split()]
    assert len(named) == len(set(named))
    assert all(reason.strip() for reason, _ in IGNORED_GROUPS + REFUSED_GROUPS)


def test_every_refusal_says_how_memory_changes_whose_argument_it_is_or_that_megatron_rejects_it() -> (
    None
):
    kinds = (
        "changes memory cpmem does not price: ",
        "Megatron-LM rejects it: ",
        "is an argument of ",
    )
    assert all(reason.startswith(kinds) for reason in REFUSED.values())


def test_a_priced_switch_is_the_snapshots_switch_and_a_priced_value_its_valued_flag() -> None:
    """The kinds of PRICED agree with argparse's actions in the snapshot: "bool" a
    store_true flag, "not" a store_false one, every other kind a flag with a value; the
    field is the flag's dest (an alias names the dest validate_args copies it into)."""
    aliases = {
        "--encoder-num-layers": "num_layers",
        "--encoder-seq-length": "seq_length",
        # the field is named after its flag; argparse's dest is microbatch_group_size_per_
        # vp_stage (ModelParallelConfig's field)
        "--microbatch-group-size-per-virtual-pipeline-stage": (
            "microbatch_group_size_per_virtual_pipeline_stage"
        ),
    }
    for flag, (name, kind) in PRICED.items():
        arg = snapshot_arguments()[flag]
        expected = {"bool": "store_true", "not": "store_false", "selective": "store_true"}
        assert arg.action == expected.get(kind, "store"), flag
        if flag == "--recompute-activations":
            continue  # validate_args turns it into recompute_granularity (arguments.py:607)
        assert aliases.get(flag, arg.dest) == name, flag


def test_every_gpt_and_moe_case_is_read_or_refused_by_classified_flags_and_rules() -> None:
    """No GPT or MoE case of golden/megatron/cases (``pretrain_gpt.py``'s) stops on a flag
    the snapshot's parser lacks: each is priced, or refused with the tables' and rules'
    reasons."""
    refused: dict[str, str] = {}
    read = 0
    paths = [
        *GOLDEN_CASES.glob("gpt/*/model_config.yaml"),
        *GOLDEN_CASES.glob("moe/*/model_config.yaml"),
    ]
    for path in sorted(paths):
        try:
            read_megatron_args(path)
            read += 1
        except InputError as exc:
            refused[path.parent.name] = exc.reason
    assert read > 100 and refused
    assert not [name for name, why in refused.items() if "is not an argument" in why]


def test_the_hybrid_cases_read_but_flextron_s_and_the_flex_dispatcher_s() -> None:
    """The hybrid and Nemotron 3 cases run ``pretrain_hybrid.py`` (recipes/h100/mamba.yaml,
    recipes/gb200/nemotron*.yaml), whose arguments the snapshot's parser reads as
    ``pretrain_gpt.py``'s: their patterns read; Flextron's case runs its own script
    (``pretrain_hybrid_flex.py``) and is refused on its flags; the nightly Nemotron 3's
    flex dispatcher with its HybridEP backend (fp32 router, expert TP 1) is read."""
    paths = [
        *GOLDEN_CASES.glob("hybrid/*/model_config.yaml"),
        *GOLDEN_CASES.glob("nemotron/*/model_config.yaml"),
    ]
    refused: dict[str, InputError] = {}
    for path in sorted(paths):
        try:
            read_megatron_args(path)
        except InputError as err:
            refused[path.parent.name] = err
    assert len(paths) == 6
    assert sorted(refused) == ["hybrid_flextron_nightly_tp2_pp1_ep2_dgx_h100_1N8G"]
    flextron = refused["hybrid_flextron_nightly_tp2_pp1_ep2_dgx_h100_1N8G"]
    assert "is Flextron's" in flextron.reason and "is not an argument" not in flextron.reason


# --- the fields a run's layout and vocabulary add ---------------------------------------


def test_the_pipeline_layout_flags_set_their_fields() -> None:
    args = _parse(
        pipeline_model_parallel_size=4,
        num_layers=16,
        num_virtual_stages_per_pipeline_rank=2,
        decoder_first_pipeline_num_layers=2,
        decoder_last_pipeline_num_layers=2,
    )
    assert args.num_virtual_stages_per_pipeline_rank == 2
    assert (args.decoder_first_pipeline_num_layers, args.decoder_last_pipeline_num_layers) == (
        2,
        2,
    )
    accounted = _parse(
        pipeline_model_parallel_size=2,
        num_layers=14,
        account_for_embedding_in_pipeline_split=True,
        account_for_loss_in_pipeline_split=True,
    )
    assert accounted.account_for_embedding_in_pipeline_split is True
    assert accounted.account_for_loss_in_pipeline_split is True
    # arguments.py:3095-3116 and transformer_config.py:137-141: None / False
    plain = _parse()
    assert plain.num_virtual_stages_per_pipeline_rank is None
    assert plain.decoder_first_pipeline_num_layers is None
    assert plain.account_for_embedding_in_pipeline_split is False


def test_no_pad_vocab_size_turns_the_padding_off_under_either_name() -> None:
    # training_config.py:686: pad_vocab_size: bool = True -> --no-/--disable-pad-vocab-size
    assert _parse().pad_vocab_size is True
    assert _parse(no_pad_vocab_size=True, vocab_size=32000).pad_vocab_size is False
    assert _parse(disable_pad_vocab_size=True, vocab_size=32000).pad_vocab_size is False


def test_encoder_num_layers_and_seq_length_are_read_as_num_layers_and_seq_length() -> None:
    # arguments.py:1308-1311, 1349-1351: taken where --num-layers / --seq-length are not
    flags = {k: v for k, v in REQUIRED.items() if k not in ("--num-layers", "--seq-length")}
    args = parse_megatron_args({**flags, "--encoder-num-layers": 6, "--encoder-seq-length": 512})
    assert (args.num_layers, args.seq_length) == (6, 512)
    with pytest.raises(InputError) as err:
        parse_megatron_args({**REQUIRED, "--encoder-num-layers": 6})
    assert err.value.value == "--num-layers --encoder-num-layers"


def test_zero_experts_is_a_dense_model_and_gqa_without_groups_has_one() -> None:
    # arguments.py:1648-1649: num_experts 0 -> None
    assert _parse(num_experts=0).num_experts is None
    # transformer_config.py:175: num_query_groups: int = 1, passed under GQA
    assert _parse(group_query_attention=True).num_query_groups == 1
    assert _parse(group_query_attention=True, num_query_groups=4).num_query_groups == 4


def test_a_yaml_list_or_bracketed_text_is_read_as_the_launcher_passes_it() -> None:
    # _run_training.sh:141-145 strips [ ] and passes the items separated by spaces
    for value in (["p2p"], "[p2p]"):
        assert _parse(cp_comm_type=value).cp_comm_type == "p2p"
    args = _parse(hierarchical_context_parallel_sizes=[2, 2], context_parallel_size=4)
    assert args.flag_values["--hierarchical-context-parallel-sizes"] == "2 2"


# --- other model families ----------------------------------------------------------------

# tests/functional_tests/test_cases/bert/bert_mcore_tp2_pp2/model_config.yaml at the
# snapshot (its model and vocabulary arguments; the rest logging and schedule)
BERT_CASE = {
    "--num-layers": 24,
    "--hidden-size": 1024,
    "--num-attention-heads": 16,
    "--micro-batch-size": 4,
    "--global-batch-size": 128,
    "--seq-length": 512,
    "--max-position-embeddings": 512,
    "--data-path": "${DATA_PATH}/text/common_pile/v01_filtered_data/my-bert_00_text_sentence",
    "--vocab-file": "${DATA_PATH}/text/common_pile/v01_filtered_data/vocab.txt",
    "--split": "949,50,1",
    "--tensor-model-parallel-size": 2,
    "--pipeline-model-parallel-size": 2,
    "--bf16": True,
    "--attention-backend": "unfused",
}
# tests/functional_tests/test_cases/t5/t5_mcore_te_tp2_pp1_vp1/model_config.yaml
T5_CASE = {
    "--encoder-num-layers": 12,
    "--decoder-num-layers": 12,
    "--hidden-size": 768,
    "--num-attention-heads": 12,
    "--kv-channels": 64,
    "--ffn-hidden-size": 3072,
    "--encoder-seq-length": 512,
    "--decoder-seq-length": 128,
    "--max-position-embeddings": 512,
    "--tensor-model-parallel-size": 2,
    "--micro-batch-size": 4,
    "--global-batch-size": 32,
    "--bf16": True,
    "--vocab-extra-ids": 100,
    "--vocab-file": "${DATA_PATH}/text/common_pile/v01_filtered_data/bert-large-cased-vocab.txt",
    "--tokenizer-type": "BertWordPieceCase",
    "--attention-backend": "unfused",
}


def test_a_bert_case_is_refused_as_bert(tmp_path: Path) -> None:
    with pytest.raises(InputError) as err:
        read_megatron_args(_write_yaml(tmp_path, BERT_CASE))
    assert "BERT" in err.value.reason and "--vocab-file without --merge-file" in err.value.value
    # the release cases also give --bert-no-binary-head (bert/bert_release)
    with pytest.raises(InputError) as err:
        parse_megatron_args({**BERT_CASE, "--bert-no-binary-head": True})
    assert "is an argument of BERT" in err.value.reason
    # the same run with GPT-2's merge file beside the vocabulary is a GPT run
    gpt = parse_megatron_args({**BERT_CASE, "--merge-file": "merges.txt"})
    assert gpt.num_layers == 24


def test_a_t5_case_is_refused_as_t5(tmp_path: Path) -> None:
    with pytest.raises(InputError) as err:
        read_megatron_args(_write_yaml(tmp_path, T5_CASE))
    assert "--decoder-num-layers 12" in str(err.value.value)
    assert "T5" in err.value.reason


def test_a_hybrid_pattern_with_sparse_attention_is_refused_naming_the_symbol() -> None:
    """'D' (DeepSeek sparse attention) is a layer megatron-core builds and cpmem does not
    price; an unknown symbol is megatron-core's ValueError (hybrid_layer_allocation.py
    _validate_pattern); both named at once with the flag's value."""
    with pytest.raises(InputError) as err:
        parse_megatron_args({**REQUIRED, "--hybrid-layer-pattern": "MD-X"})
    assert err.value.value == "--hybrid-layer-pattern MD-X"
    assert "'D' in the main pattern is DeepSeek sparse attention" in err.value.reason
    assert "'X' is not a valid layer symbol" in err.value.reason


def test_a_moe_gpt_is_read() -> None:
    args = parse_megatron_args({**REQUIRED, "--num-experts": 8, "--moe-router-topk": 2})
    assert args.num_experts == 8
