"""The step's settings, declared once: each keyword of ``describe_settings`` with its type,
its default, its command-line flag and help, and what the external estimators' description
reports of it.

``SettingsArguments`` is the typed declaration: every key is a keyword of
``cpmem.step.describe.describe_settings`` (which fills what is not given from ``DEFAULTS``),
of ``describe_step``, the API and admission, and its ``Annotated`` ``Setting`` says the rest.
From it come:

- the command line's flags, their help and their groups (``cpmem.cli`` builds them, every
  setting flag defaulting to *absent*, so ``given_settings`` knows which flags were typed,
  a default typed explicitly included; the Megatron-LM door takes exactly those as its
  overrides);
- the API's parameters (``Unpack[SettingsArguments]``) and their defaults (``DEFAULTS``);
- the external estimators' description (``Setting.export``: the resolved value a step
  holds under the keyword's name, ``cpmem.gate.external.step_description``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, get_type_hints

from cpmem.step.cuda_graphs import CudaGraphs, graphs_label
from cpmem.step.device import Device
from cpmem.step.fp8 import Fp8
from cpmem.step.offload import Offload
from cpmem.step.ranks import RankChoice
from cpmem.step.runtime import ATTENTION_BACKENDS, QUANTIZED_WEIGHTS, RUNTIMES, TRAININGS, Runtime
from cpmem.step.setting import Setting
from cpmem.step.settings_request import RequestSettings
from cpmem.step.trainer import FSDP_BUFFERS, FSDP_STRATEGIES, MUON_LAYOUTS
from cpmem.step.values import parse_int_list, whole_bytes


class SettingsArguments(RequestSettings, total=False):
    """The step's settings: ``describe_settings``'s keywords, each with its declaration
    (``Setting``): ``RequestSettings``' (the model, the request, the step's shape), then
    the process's, the whole job's, the pipeline's and the API's."""

    runtime: Annotated[
        str | Runtime,
        Setting(
            "art",
            "--runtime",
            "the process: art (ART's LoRA trainer, the calibration harness golden/ measured; "
            "default) or megatron-lm (Megatron-LM's pretrain_gpt.py: its data loader's mask, "
            "its CP split, p2p CP comm, no fitted margin)",
            group="process",
            choices=RUNTIMES,
            export=lambda s: s.settings.runtime.name,
        ),
    ]
    training: Annotated[
        str,
        Setting(
            "lora",
            "--training",
            "what is trained: lora (adapters on a frozen base; default) or full (every "
            "parameter: bf16 weights, fp32 main gradients, Adam's master copy and moments)",
            group="process",
            choices=TRAININGS,
            export=lambda s: s.settings.training,
        ),
    ]
    attention_backend: Annotated[
        str | None,
        Setting(
            None,
            "--attention-backend",
            "the core attention's kernel: fused (cuDNN), flash (flash-attn), unfused or local "
            "(s x s probabilities kept), or auto: the one Transformer Engine's selection picks "
            "for the run (never unfused under CP); default: the runtime's (ART: fused; "
            "--megatron-args: its own --attention-backend)",
            group="process",
            choices=("auto", *ATTENTION_BACKENDS),
            exported_as="runtime_settings: the backend resolved, with what was asked",
        ),
    ]
    container: Annotated[
        str,
        Setting(
            "dev",
            "--container",
            "the container the run's software is read from: Transformer Engine's attention "
            "choice under --attention-backend auto, and the PyTorch that compiles the fused "
            "cross entropy (--head fused): dev (NGC PyTorch 25.11, TE 2.11; default), "
            "ngc-24.10 (PyTorch 2.5) or ngc-24.01 (Megatron-LM's lts image until 2025-11-06, "
            "PyTorch 2.2, whose flash-attn TE does not use); another name is refused, and one "
            "that neither reads is listed as ignored",
            group="process",
            exported_as="runtime_settings: the container",
        ),
    ]
    etp: Annotated[
        int | None,
        Setting(
            None,
            "--etp",
            "expert tensor parallel size, MoE models (default 1: each routed expert whole on "
            "its EP rank, as the measured runtime runs them; --megatron-args and --runtime "
            "megatron-lm: TP); must divide the experts' FFN width, and be 1 for experts with "
            "biases (megatron-core's rules)",
            group="process",
            cli_type=int,
            export=lambda s: s.plan.layout.etp,
        ),
    ]
    dtype: Annotated[
        str,
        Setting(
            "bf16",
            "--dtype",
            "the dtype of the parameters (frozen base, adapters, full training's weights) and "
            "activations: bf16 (default), fp16 or fp32; fp32 parameters have no fp32 master "
            "copy (megatron-core steps them in place), and Transformer Engine runs fp32 "
            "attention unfused (flash and fused are refused; the default backend is then auto)",
            group="process",
            choices=("bf16", "fp16", "fp32"),
            exported_as="dtype (the recorded activations' dtype) and dtype_bytes",
        ),
    ]
    quantized_weights: Annotated[
        str,
        Setting(
            "dequantized",
            "--quantized-weights",
            "a quantized checkpoint's frozen base: dequantized (default: in --dtype, as "
            "Megatron-Bridge imports it) or stored (its fp8 / mxfp4 values and scales; LoRA only)",
            group="process",
            choices=QUANTIZED_WEIGHTS,
            export=lambda s: s.settings.quantized_weights,
        ),
    ]
    fp8: Annotated[
        str | Fp8 | None,
        Setting(
            None,
            "--fp8",
            "FP8 training, RECIPE[:param-gather][:history=N][:bf16-layers=I,J,...] (priced: "
            "tensorwise, blockwise and delayed, with its amax history, default 1, each with or "
            "without param-gather; mxfp8 without it; bf16-layers: 0-based layers kept out of "
            "FP8)",
            group="process",
            export=lambda s: None if s.settings.fp8 is None else s.settings.fp8.label,
        ),
    ]
    cuda_graphs: Annotated[
        str | CudaGraphs | None,
        Setting(
            None,
            "--cuda-graphs",
            "per-layer CUDA graphs, IMPL[:MODULES] (priced: transformer_engine with modules "
            "among attn, mlp, moe_router, moe_preprocess, mamba; their static inputs and "
            "output gradients)",
            group="process",
            export=lambda s: graphs_label(s.settings.cuda_graphs),
        ),
    ]
    tp_comm_overlap: Annotated[
        bool,
        Setting(
            False,
            "--tp-comm-overlap",
            "TE's TP comm overlap (its GEMMs' workspace; userbuffers named, unpriced)",
            group="process",
            switch=True,
            export=lambda s: s.settings.tp_comm_overlap,
        ),
    ]
    rank: Annotated[
        RankChoice | str,
        Setting(
            "busiest",
            "--rank",
            "the rank answered: busiest (default: the stage and data-parallel rank where "
            "static memory and activations together peak), last (the last global rank, which "
            "Megatron-LM logs) or a global rank number in megatron's order (tp-cp-ep-dp-pp); "
            "it picks the pipeline stage and the distributed optimizer's slice, the "
            "activations are the busiest CP rank's (listed as ignored where no stage or slice "
            "differs)",
            group="process",
            export=lambda s: s.settings.rank,
        ),
    ]
    dp: Annotated[
        int,
        Setting(
            1,
            "--dp",
            "data-parallel ranks (a distributed optimizer shards its states over them; "
            "default 1, or --world-size / (TP x CP x PP))",
            group="whole",
            cli_type=int,
            export=lambda s: s.plan.layout.dp,
        ),
    ]
    optimizer: Annotated[
        str,
        Setting(
            "adam",
            "--optimizer",
            "how the trained parameters are stepped: adam (default), sgd, muon (one "
            "momentum per matrix; vectors, embedding and output layer by Adam), none "
            "(static memory)",
            group="whole",
            choices=("adam", "sgd", "muon", "none"),
            export=lambda s: s.settings.optimizer.kind,
        ),
    ]
    distributed_optimizer: Annotated[
        bool,
        Setting(
            False,
            "--distributed-optimizer",
            "megatron's distributed optimizer: master copy and moments / dp",
            group="whole",
            switch=True,
            export=lambda s: s.settings.optimizer.distributed,
        ),
    ]
    muon_layout: Annotated[
        str,
        Setting(
            "legacy",
            "--muon-layout",
            "Muon's distributed buffers: legacy (default; --no-use-layer-wise-param-layout), "
            "precomputed (Megatron-LM's default: matrices bin-packed by shard) or bucketed "
            "(precomputed, in --overlap-grad-reduce's buckets)",
            group="whole",
            choices=MUON_LAYOUTS,
            export=lambda s: s.settings.optimizer.muon_layout,
        ),
    ]
    fsdp: Annotated[
        str,
        Setting(
            "none",
            "--fsdp",
            "Megatron FSDP's sharding strategy (--use-megatron-fsdp): no_shard, optim, "
            "optim_grads, optim_grads_params (weights too); torch_fsdp2 (--use-torch-fsdp2: "
            "PyTorch's fully_shard, every parameter sharded); none (default): megatron's DDP",
            group="whole",
            choices=FSDP_STRATEGIES,
            export=lambda s: s.settings.optimizer.fsdp,
        ),
    ]
    fsdp_buffers: Annotated[
        str,
        Setting(
            "dynamic",
            "--fsdp-buffers",
            "how Megatron FSDP allocates its units' gathered and gradient buckets: dynamic "
            "(default: each when used), double-buffer (--fsdp-double-buffer: two of each "
            "kept between steps), nccl-ub (--use-nccl-ub: those from an NCCL memory pool)",
            group="whole",
            choices=FSDP_BUFFERS,
            export=lambda s: s.settings.optimizer.fsdp_buffers,
        ),
    ]
    optimizer_instances: Annotated[
        int,
        Setting(
            1,
            "--optimizer-instances",
            "copies of the distributed optimizer over the data-parallel ranks (Megatron-LM's "
            "--num-distributed-optimizer-instances): each shards the master copy and moments "
            "over DP x CP / N ranks (default 1)",
            group="whole",
            cli_type=int,
            export=lambda s: s.settings.optimizer.instances,
        ),
    ]
    device: Annotated[
        str | Device | None,
        Setting(
            None,
            "--device",
            "a device preset (a100-80gb, h100, h200, b200, mi300x): admit against what it "
            "leaves once the static memory is allocated; estimate reports that budget",
            group="whole",
            export=lambda s: None if s.settings.device is None else s.settings.device.name,
        ),
    ]
    device_total_bytes: Annotated[
        int | None,
        Setting(
            None,
            "--device-total-bytes",
            "the device's total memory in bytes, as the runtime reports it (a device without "
            "a preset; with --free-bytes: the runtime's own budget rule)",
            group="whole",
            cli_type=float,
            convert=whole_bytes,
            export=lambda s: None if s.settings.device is None else s.settings.device.total_bytes,
        ),
    ]
    pp: Annotated[
        int,
        Setting(
            1,
            "--pp",
            "pipeline stages (megatron's 1F1B; the busiest stage's figure, every stage's in "
            "stage_bytes)",
            group="pipeline",
            cli_type=int,
            export=lambda s: s.settings.pipeline.pp,
        ),
    ]
    vpp: Annotated[
        int,
        Setting(
            1,
            "--vpp",
            "virtual stages per pipeline stage (megatron's interleaved 1F1B)",
            group="pipeline",
            cli_type=int,
            export=lambda s: s.settings.pipeline.vpp,
        ),
    ]
    microbatches: Annotated[
        int,
        Setting(
            1,
            "--microbatches",
            "micro-batches per step, each the request given (default 1)",
            group="pipeline",
            cli_type=int,
            export=lambda s: s.settings.pipeline.microbatches,
        ),
    ]
    stage_layers: Annotated[
        Sequence[int] | None,
        Setting(
            None,
            "--stage-layers",
            "layers per stage (pp counts) or per virtual stage (pp x vpp), comma-separated "
            "(default: even)",
            group="pipeline",
            convert=parse_int_list,
            exported_as="stage_layers: every virtual stage's layer count, as laid out",
        ),
    ]
    first_stage_layers: Annotated[
        int | None,
        Setting(
            None,
            "--first-stage-layers",
            "layers on the first stage (megatron's num_layers_in_first_pipeline_stage; the "
            "other stages share the rest evenly)",
            group="pipeline",
            cli_type=int,
            exported_as="stage_layers",
        ),
    ]
    last_stage_layers: Annotated[
        int | None,
        Setting(
            None,
            "--last-stage-layers",
            "layers on the last stage (num_layers_in_last_pipeline_stage)",
            group="pipeline",
            cli_type=int,
            exported_as="stage_layers",
        ),
    ]
    output_bytes: Annotated[
        int | None,
        Setting(None, None, group="api", exported_as="output_bytes: the step's outputs"),
    ]
    grad_bytes: Annotated[
        int | None,
        Setting(None, None, group="api", export=lambda s: s.settings.optimizer.grad_bytes),
    ]
    microbatch_group: Annotated[
        int | None,
        Setting(None, None, group="api", export=lambda s: s.settings.pipeline.group),
    ]
    deferred_wgrad: Annotated[
        int | None,
        Setting(None, None, group="api", export=lambda s: s.settings.pipeline.deferred_wgrad),
    ]
    offload: Annotated[
        Offload | str | Sequence[str] | None,
        Setting(None, None, group="api", export=lambda s: s.settings.offload.words),
    ]


def _declarations() -> dict[str, Setting]:
    hints = get_type_hints(SettingsArguments, include_extras=True)
    out = {}
    for name, hint in hints.items():
        settings = [m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Setting)]
        if len(settings) != 1:
            raise TypeError(f"setting {name!r} needs exactly one Setting declaration")
        out[name] = settings[0]
    return out


SETTINGS: Mapping[str, Setting] = _declarations()
"""Every setting's declaration, in ``SettingsArguments`` order."""

DEFAULTS: Mapping[str, Any] = {name: s.default for name, s in SETTINGS.items()}
"""What ``describe_settings`` takes where a keyword is not given."""
