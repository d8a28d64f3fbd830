"""Native measurement driver: real forward/backward peaks of rank-1 LoRA fine-tunes.

Why it exists: cpmem's estimates must be checked against memory that a real model
allocates, measured the way the golden sources were (incremental allocated bytes
above the pre-forward baseline, maxima over every rank and two repetitions).

One invocation (``python -m gpu_tests.driver ...``) measures one cell: a model (cpmem
preset or config.json, random bf16 weights, optionally truncated to its first
``--layers`` layers), a request (``--lengths``, ``--shared-prefix``), a layout
(``--tp``, ``--cp``, ``--sp``) and a recompute setting. Two engines build the model:

- ``megatron`` (engine_megatron.py): megatron-core's GPTModel with the local (no
  Transformer Engine) layer spec; attention-only models, CP = 1. Runs on CUDA, and on
  CPU through a small shim for this driver's own tests.
- ``torch`` (engine_torch.py): this package's own decoder (attention with optional
  output gate, Gated DeltaNet, SwiGLU MLP). Context parallelism (cp_attention.py): each
  rank computes its own queries against the keys/values it all-gathers from every rank
  (NCCL on several GPUs, or gloo with every process sharing one GPU). Hybrid models
  always use it; GDN runs on fla's kernel or the pure-torch fallback (gdn.py).

Every CP rank owns a contiguous run of the packed row whose length is the token count
cpmem's default planner gives that rank, so the driver measures the layout cpmem
prices. Rows follow the golden schema (``golden/schema.json``, rows.py); the driver
never writes to ``golden/`` (``cpmem.golden.importer.append_rows`` does). On CPU no
memory figure is meaningful: peaks are left empty and the row is marked ``device=cpu``.

A cell can also run a trainer's step beyond the harness, as cpmem prices it
(``cpmem.step.trainer``): ``--head logits|chunked:N`` (head.py: final norm, frozen
output layer and cross entropy, or chunked log-probs recomputed in backward),
``--lora-rank R`` and ``--lora-dropout P``. The defaults are the harness, measured
exactly as before; a trainer row carries its settings in the sidecar ``trainer_step``
column (rows.py), which golden/'s importer refuses.

``history.py`` (``python -m gpu_tests.driver.history SNAPSHOT``) analyses the snapshots
``--memory-history`` records: which tensors are live at the forward peak. It is not
imported here, so that running it as a module does not import it twice.

The names below are the driver's importable interface (tests use them); each lives in
the module named beside it.
"""

from __future__ import annotations

from cpmem.errors import CpmemError, InputError
from cpmem.plan.request import Request

from .cli import build_parser, comparison_line, main
from .cp_attention import Dist, Piece, RowLayout, SegmentSpan, gather_tokens
from .engine_megatron import build_megatron_model, install_megatron_cpu_shim
from .engine_torch import RankContext, build_torch_model, make_lora_group, make_lora_linear
from .gdn import (
    FLA_CHUNK,
    GDN_CHUNK,
    count_saved,
    fla_equivalent_saved_bytes,
    gdn_chunked_torch,
    gdn_kernel,
    gdn_reference_recurrent,
    have_fla,
)
from .head import build_head, have_megatron_cross_entropy, head_description
from .measure import REPETITIONS, RankSample, measure_step, run_rank
from .paths import PACKAGE_DIR, REPO_ROOT
from .provenance import (
    CAMPAIGN,
    SOURCE_PATH,
    SOURCE_REPOSITORY,
    driver_files,
    driver_sha256,
    git_revision,
    provenance,
)
from .rows import (
    APPENDED_BY,
    BYTE_COLUMNS,
    GOLDEN_COLUMNS,
    HARNESS_STEP,
    PHASE,
    TRAINER_COLUMN,
    aggregate,
    build_row,
    cell_tag,
    merge_cell_rows,
    trainer_step,
    write_rows,
)
from .run import finish, run_cell, worker_main
from .spec import (
    DEVICES,
    ENGINES,
    HEAD_CES,
    HEADS,
    MODES,
    MODULE_SETS,
    CellSpec,
    cell_estimate,
    cell_geometry,
    cell_plan,
    parse_head,
    parse_lengths,
    recorded_model_name,
    spec_from_args,
    validate_spec,
)

__all__ = [
    "APPENDED_BY",
    "BYTE_COLUMNS",
    "CAMPAIGN",
    "DEVICES",
    "ENGINES",
    "FLA_CHUNK",
    "GDN_CHUNK",
    "GOLDEN_COLUMNS",
    "HARNESS_STEP",
    "HEADS",
    "HEAD_CES",
    "MODES",
    "MODULE_SETS",
    "PACKAGE_DIR",
    "PHASE",
    "REPETITIONS",
    "REPO_ROOT",
    "SOURCE_PATH",
    "SOURCE_REPOSITORY",
    "TRAINER_COLUMN",
    "CellSpec",
    "CpmemError",
    "Dist",
    "InputError",
    "Piece",
    "RankContext",
    "RankSample",
    "Request",
    "RowLayout",
    "SegmentSpan",
    "aggregate",
    "build_head",
    "build_megatron_model",
    "build_parser",
    "build_row",
    "build_torch_model",
    "cell_estimate",
    "cell_geometry",
    "cell_plan",
    "cell_tag",
    "comparison_line",
    "count_saved",
    "driver_files",
    "driver_sha256",
    "finish",
    "fla_equivalent_saved_bytes",
    "gather_tokens",
    "gdn_chunked_torch",
    "gdn_kernel",
    "gdn_reference_recurrent",
    "git_revision",
    "have_fla",
    "have_megatron_cross_entropy",
    "head_description",
    "install_megatron_cpu_shim",
    "main",
    "make_lora_group",
    "make_lora_linear",
    "measure_step",
    "merge_cell_rows",
    "parse_head",
    "parse_lengths",
    "provenance",
    "recorded_model_name",
    "run_cell",
    "run_rank",
    "spec_from_args",
    "trainer_step",
    "validate_spec",
    "worker_main",
    "write_rows",
]
