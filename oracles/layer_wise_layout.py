"""Megatron-LM's own layer-wise layout, run on CPU: the oracle for Muon's precomputed
layer-wise distributed-optimizer buffers.

``LayerWiseDistributedOptimizer._compute_per_buffer_param_layout`` at the recordings'
snapshot (NVIDIA/Megatron-LM ``SNAPSHOT``, ``megatron/core/optimizer/
layer_wise_optimizer.py``) is a static method that reads only each parameter's shape and
element count and ``ddp_config.pad_buckets_for_high_nccl_busbw``. The installed
megatron-core (0.16.1) predates it, and the snapshot's package does not import on this
CPU machine (triton), so this module reads the two files it needs from a git mirror of
Megatron-LM (``MEGATRON_LM_GIT_DIR``, default ``/work/.mirror/NVIDIA+Megatron-LM/repo``),
runs ``param_layout.py`` as it is and ``layer_wise_optimizer.py`` with its other
imports stubbed (none of them is called by the method), and calls the method on meta
tensors of the given shapes. What it returns is read the way
``_shard_params_from_layout`` reads the layout: the shard of each parameter is its
offset in its bucket divided by the bucket's shard size.

Never imports cpmem: the comparison is ``tests/oracle/test_layer_wise_layout_oracle.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SNAPSHOT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
DEFAULT_GIT_DIR = "/work/.mirror/NVIDIA+Megatron-LM/repo"
_PACKAGE = "_oracle_layer_wise"


def git_dir() -> Path:
    return Path(os.environ.get("MEGATRON_LM_GIT_DIR", DEFAULT_GIT_DIR))


def available() -> bool:
    """Whether the mirror holds the snapshot's file."""
    try:
        _source("megatron/core/optimizer/layer_wise_optimizer.py")
    except (OSError, subprocess.CalledProcessError):
        return False
    return True


def _source(path: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", str(git_dir()), "show", f"{SNAPSHOT}:{path}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


class _Stub(types.ModuleType):
    """A module whose every attribute is a placeholder class (the imports the method
    never calls)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})


def _load() -> Any:
    """The snapshot's ``LayerWiseDistributedOptimizer`` class, loaded once."""
    cached = sys.modules.get(f"{_PACKAGE}.layer_wise_optimizer")
    if cached is not None:
        return cached.LayerWiseDistributedOptimizer
    package = types.ModuleType(_PACKAGE)
    package.__path__ = []
    sys.modules[_PACKAGE] = package
    for name in ("clip_grads", "optimizer", "optimizer_config"):
        sys.modules[f"{_PACKAGE}.{name}"] = _Stub(f"{_PACKAGE}.{name}")
    stubbed = (
        "megatron",
        "megatron.core",
        "megatron.core.dist_checkpointing",
        "megatron.core.dist_checkpointing.dict_utils",
        "megatron.core.dist_checkpointing.mapping",
        "megatron.core.distributed",
        "megatron.core.distributed.param_and_grad_buffer",
        "megatron.core.process_groups_config",
        "megatron.core.utils",
    )
    saved = {name: sys.modules.get(name) for name in stubbed}
    for name in stubbed:
        sys.modules[name] = _Stub(name)
    utils = sys.modules["megatron.core.utils"]
    utils.log_single_rank = lambda *args, **kwargs: None  # type: ignore[attr-defined]
    try:
        for name in ("param_layout", "layer_wise_optimizer"):
            module = types.ModuleType(f"{_PACKAGE}.{name}")
            module.__package__ = _PACKAGE
            sys.modules[module.__name__] = module
            code = _source(f"megatron/core/optimizer/{name}.py")
            exec(compile(code, f"{SNAPSHOT[:8]}:{name}.py", "exec"), module.__dict__)
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    return sys.modules[f"{_PACKAGE}.layer_wise_optimizer"].LayerWiseDistributedOptimizer


@dataclass(frozen=True)
class OracleLayout:
    """Megatron-LM's layout: ``numel`` (the buffer's end) and each shard's real elements."""

    numel: int
    shard_elements: tuple[int, ...]


def megatron_layout(
    shapes: Sequence[tuple[int, int]], shards: int, bucket_size: int | None = None
) -> OracleLayout:
    """Megatron-LM's layout of 2-D parameters of ``shapes`` (model order) over ``shards``."""
    cls = _load()
    params = [torch.nn.Parameter(torch.empty(shape, device="meta")) for shape in shapes]
    config = types.SimpleNamespace(pad_buckets_for_high_nccl_busbw=False)
    layout = cls._compute_per_buffer_param_layout(params, bucket_size, shards, config)
    elements = [0] * shards
    for start, end, bucket in layout.param_index_map.values():
        lo, hi = layout.bucket_indices[bucket]
        size = (hi - lo) // shards
        shard = (start - lo) // size
        assert end <= lo + (shard + 1) * size, "a parameter crosses its shard"
        elements[shard] += end - start
    numel = layout.bucket_indices[-1][1] if layout.bucket_indices else 0
    return OracleLayout(numel, tuple(elements))
