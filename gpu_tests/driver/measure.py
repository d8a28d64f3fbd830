"""Measuring one rank: build its model, run REPETITIONS steps, record their peaks.

Why it is done this way: the golden sources measured incremental allocated bytes above
the pre-forward baseline (``max_memory_allocated`` after ``reset_peak_memory_stats``),
forward and forward+backward, and the driver must measure the same quantity. On CPU no
figure is recorded (None), never invented. The harness's forward returns the hidden
states and its loss (their mean square) is made after the forward figures are taken; a
trainer cell's forward ends with its head (head.py) and returns the loss itself.
"""

from __future__ import annotations

import gc
import math
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cpmem.errors import InputError
from cpmem.plan.request import Request
from cpmem.step.recompute import Recompute

from .cp_attention import Dist, RowLayout
from .engine_megatron import build_megatron_model, install_megatron_cpu_shim
from .engine_torch import RankContext, build_torch_model
from .gdn import have_fla
from .head import build_head, head_description, init_megatron_parallel_state
from .spec import CellSpec, cell_geometry, cell_plan
from .torchlib import load_torch

REPETITIONS = 2
# Trace entries kept by --memory-history (a ring buffer: the oldest are overwritten).
HISTORY_MAX_ENTRIES = 2_000_000


@dataclass
class RankSample:
    """One rank, one repetition. Byte figures are None where not measured (CPU)."""

    rank: int
    repetition: int
    baseline_bytes: int | None
    available_bytes: int | None
    forward_peak_bytes: int | None
    retained_bytes: int | None
    forward_backward_peak_bytes: int | None
    loss: float
    loss_finite: bool
    adapter_params: int
    adapter_grads_present: int
    adapter_grads_finite: bool
    adapter_grads_nonzero: int
    # GDN on the torch fallback only (else None): what autograd saved inside it, what
    # fla's kernel would have saved for the same calls, and the difference (gdn.py).
    gdn_fallback_saved_bytes: int | None = None
    gdn_fallback_total_saved_bytes: int | None = None
    gdn_fla_equivalent_saved_bytes: int | None = None
    # The caching allocator's own figures beside the block-size ones above: the bytes
    # callers asked for (``requested_bytes``: before the allocator rounds a request up
    # to its block) at the forward peak and after forward, over the same baseline. The
    # difference is allocator rounding, a fixed cost per live tensor the estimator does
    # not price (the 27B short cells' unexplained 35-130 MiB, docs/tight.md).
    forward_peak_requested_bytes: int | None = None
    retained_requested_bytes: int | None = None


def measure_step(
    forward: Callable[[], Any],
    adapters: Sequence[Any],
    device: Any,
    rank: int,
    rep: int,
    after_forward: Callable[[], None] | None = None,
) -> RankSample:
    """One forward + backward; CUDA peaks relative to the pre-forward baseline.

    The harness's forward returns hidden states (loss: their mean square, made after the
    forward figures); a forward that ends with a head (head.py) returns its scalar loss
    (a 0-dim tensor), which backward starts from. ``after_forward`` runs once the
    forward figures are taken (the history marker).
    """
    torch = load_torch()
    for p in adapters:
        p.grad = None
    gc.collect()
    cuda = device.type == "cuda"
    base = avail = fwd = kept = fwbw = base_requested = None
    if cuda:
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        base_requested = _requested(torch, device, "current")
        avail = torch.cuda.mem_get_info(device)[0]
        torch.cuda.reset_peak_memory_stats(device)
    hidden = forward()
    fwd_requested = kept_requested = None
    if cuda:
        torch.cuda.synchronize(device)
        fwd = torch.cuda.max_memory_allocated(device) - base
        kept = torch.cuda.memory_allocated(device) - base
        if base_requested is not None:
            fwd_requested = _requested(torch, device, "peak") - base_requested
            kept_requested = _requested(torch, device, "current") - base_requested
    if after_forward is not None:
        after_forward()
    loss = hidden if hidden.dim() == 0 else hidden.float().pow(2).mean()
    loss.backward()
    if cuda:
        torch.cuda.synchronize(device)
        fwbw = torch.cuda.max_memory_allocated(device) - base
    value = float(loss.detach())
    grads = [p.grad for p in adapters]
    present = [gr for gr in grads if gr is not None]
    sample = RankSample(
        rank=rank,
        repetition=rep,
        baseline_bytes=base,
        available_bytes=avail,
        forward_peak_bytes=fwd,
        retained_bytes=kept,
        forward_backward_peak_bytes=fwbw,
        loss=value,
        loss_finite=math.isfinite(value),
        adapter_params=len(adapters),
        adapter_grads_present=len(present),
        adapter_grads_finite=all(bool(torch.isfinite(gr).all()) for gr in present),
        adapter_grads_nonzero=sum(1 for gr in present if bool(gr.abs().sum() > 0)),
        forward_peak_requested_bytes=fwd_requested,
        retained_requested_bytes=kept_requested,
    )
    del hidden, loss
    return sample


def _requested(torch: Any, device: Any, which: str) -> int | None:
    """The allocator's ``requested_bytes`` (current or peak), None where this torch's
    ``memory_stats`` has no such figure."""
    value = torch.cuda.memory_stats(device).get(f"requested_bytes.all.{which}")
    return None if value is None else int(value)


def cpmem_forward_end(device: Any) -> None:
    """Allocate (and free) one element: its frame marks the forward's end in a history.

    The name is history.FORWARD_END_MARKER; the analyser splits forward from backward
    at the first allocation made here.
    """
    load_torch().empty(1, device=device)


def record_history_step(
    forward: Callable[[], Any], adapters: Sequence[Any], device: Any, rank: int, path: str
) -> list[str]:
    """One extra, unmeasured step after the measured ones; rank 0 records its history.

    Why an extra step: the measured repetitions stay exactly as without the flag.
    Every rank runs it (their collectives must match); only rank 0 records, with python
    stacks only (C++ stacks can take minutes to symbolise at dump time). Its own peaks go
    into the note: the history's forward peak should equal its forward figure. A failed
    dump is a note, not a failed cell. Returns the notes for the summary.
    """
    torch = load_torch()
    if device.type != "cuda":
        return [f"memory history not recorded: no CUDA device ({path})"]
    record = rank == 0
    if record:
        torch.cuda.memory._record_memory_history(
            "all", context="all", stacks="python", max_entries=HISTORY_MAX_ENTRIES
        )
    try:
        s = measure_step(
            forward, adapters, device, rank, REPETITIONS, lambda: cpmem_forward_end(device)
        )
        if not record:
            return []
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            torch.cuda.memory._dump_snapshot(path)
        except (OSError, RuntimeError) as exc:
            return [f"memory history of rank 0 could not be written to {path}: {exc}"]
    finally:
        if record:
            torch.cuda.memory._record_memory_history(None)
    return [
        f"memory history: rank 0's extra, unmeasured step (repetition {REPETITIONS}, after "
        f"the {REPETITIONS} measured ones; forward peak {s.forward_peak_bytes} B, "
        f"forward+backward {s.forward_backward_peak_bytes} B) recorded to {path}; "
        "analyse with python -m gpu_tests.driver.history"
    ]


def _pick_device(spec: CellSpec, local_rank: int) -> Any:
    torch = load_torch()
    want = spec.device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda":
        if not torch.cuda.is_available():
            raise InputError("device", "cuda", "no CUDA device is visible")
        # more ranks than GPUs: every rank shares one GPU (gloo between them)
        index = local_rank if torch.cuda.device_count() >= spec.world else 0
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def run_rank(spec: CellSpec, rank: int = 0, world: int = 1, local_rank: int = 0) -> dict[str, Any]:
    """Build the model on this rank and measure REPETITIONS steps; returns its samples."""
    torch = load_torch()
    device = _pick_device(spec, local_rank)
    geometry = cell_geometry(spec)
    plan = cell_plan(spec, geometry)
    request = Request.shared(list(spec.lengths), spec.shared_prefix)
    torch.manual_seed(spec.seed)
    dist = torch.distributed
    megatron_ce = spec.head == "logits" and spec.head_ce == "megatron"
    needs_group = world > 1 or spec.engine == "megatron" or megatron_ce
    if needs_group and not dist.is_initialized():
        if world == 1:
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(free_port()))
        shared_gpu = device.type == "cuda" and torch.cuda.device_count() < world
        backend = "nccl" if device.type == "cuda" and not shared_gpu else "gloo"
        dist.init_process_group(backend, rank=rank, world_size=world)
    notes: list[str] = []
    if spec.head != "hidden":
        notes.append(head_description(spec))
    if not spec.harness_adapters:
        notes.append(
            f"adapters: LoRA rank {spec.lora_rank}, dropout {spec.lora_dropout:g} (torch "
            "dropout on the adapter input before A); one adapter per "
            + (
                "megatron projection (fused QKV, fused gate/up)"
                if spec.engine == "megatron"
                else "group of projections sharing an input (q/k/v, gate/up, GDN in_proj)"
            )
        )
    kernel = None
    forward_counts = [0, 0]  # GDN fallback, per forward: saved inside it, fla's equivalent
    if spec.engine == "megatron":
        if device.type == "cpu":
            install_megatron_cpu_shim()
        rows = plan.rank_tokens[0]
        layout = RowLayout.from_plan(request, [rows])
        model = build_megatron_model(spec, geometry, device, rows)
        ids = torch.randint(0, geometry.vocab, (1, rows), device=device)
        pos = torch.tensor([layout.positions(0)], device=device)
        head = build_head(spec, geometry, device)
        labels = None if head is None else torch.randint(0, geometry.vocab, (rows,), device=device)

        def forward() -> Any:
            out = model(ids, pos, attention_mask=None)
            return out if head is None else head(out, labels)

        notes.append(
            "megatron local spec: one packed row under a plain causal mask (shapes as "
            "packed; no per-sequence mask), unfused score-materialising attention"
        )
        gdn_counts: list[int] = []
        fla_counts: list[int] = []
    else:
        layout = RowLayout.from_plan(request, plan.groups[0].attention_tokens)
        ctx = RankContext(
            layout,
            rank,
            Dist(rank, world, device),
            Recompute.parse(spec.recompute, spec.modules or None),
            lora_rank=spec.lora_rank,
            lora_dropout=spec.lora_dropout,
        )
        ctx.positions = torch.tensor(layout.positions(rank), device=device)
        fused = device.type == "cuda" and have_fla()
        ctx.count_gdn_saved = geometry.is_hybrid and not fused
        kernel = None if not geometry.is_hybrid else ("fla" if fused else "torch-fallback")
        model = build_torch_model(geometry, ctx, device)
        lo, hi = layout.rank_range(rank)
        gen = torch.Generator().manual_seed(spec.seed)
        ids = torch.randint(0, geometry.vocab, (layout.total,), generator=gen)[lo:hi].to(device)
        head = build_head(spec, geometry, device)
        if megatron_ce:
            if device.type == "cpu":
                install_megatron_cpu_shim()
            init_megatron_parallel_state()
        labels = None
        if head is not None:  # random token ids over the whole row; this rank's part
            gen_labels = torch.Generator().manual_seed(spec.seed + 1)
            labels = torch.randint(0, geometry.vocab, (layout.total,), generator=gen_labels)
            labels = labels[lo:hi].to(device)

        def forward() -> Any:
            from torch.utils.checkpoint import set_checkpoint_early_stop

            # every rank must replay the same collectives when a checkpoint recomputes
            with set_checkpoint_early_stop(False):
                out = model(ids)
                if head is not None:
                    out = head(out, labels)
            # forward-time sums: a full-recompute replay in backward would count again
            forward_counts[:] = [sum(gdn_counts), sum(fla_counts)]
            return out

        gdn_counts, fla_counts = ctx.gdn_saved_bytes, ctx.gdn_fla_bytes
        if kernel == "torch-fallback":
            notes.append(
                "GDN ran on the pure-torch chunked fallback (fla not installed or no CUDA): "
                "peaks include its extra saved fp32 chunk tensors; per rank-sample, "
                "gdn_fallback_saved_bytes = gdn_fallback_total_saved_bytes (what autograd "
                "saved inside it) - gdn_fla_equivalent_saved_bytes (what fla's kernel saves "
                "for the same calls, from its saved-tensor list, counted the same way)"
            )
            if spec.recompute == "full":
                notes.append(
                    "full recompute with the GDN fallback: the counting hook replaces the "
                    "checkpoint's inside GDN mixing, so its tensors are kept, not recomputed"
                )
        if world > 1 and geometry.is_hybrid:
            notes.append(
                "cross-rank GDN states are passed forward exactly but detached (their "
                "gradient is not sent back); no saved tensor or activation shape changes"
            )
    adapters = [p for n, p in model.named_parameters() if "lora_" in n]
    samples = []
    for rep in range(REPETITIONS):
        gdn_counts.clear()
        fla_counts.clear()
        s = measure_step(forward, adapters, device, rank, rep)
        if kernel == "torch-fallback":
            total, fla = forward_counts
            s.gdn_fallback_total_saved_bytes = total
            s.gdn_fla_equivalent_saved_bytes = fla
            s.gdn_fallback_saved_bytes = total - fla
        samples.append(asdict(s))
    if spec.memory_history is not None:
        notes.extend(record_history_step(forward, adapters, device, rank, spec.memory_history))
    result = {
        "rank": rank,
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "engine": spec.engine,
        "gdn_kernel": kernel,
        "head": spec.head,
        "head_ce": spec.head_ce or None,
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "rank_tokens": layout.rank_tokens[rank] if spec.engine == "torch" else layout.total,
        "samples": samples,
        "notes": notes,
    }
    if dist.is_initialized() and world > 1:
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, result)
        return {"ranks": gathered}
    return {"ranks": [result]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
