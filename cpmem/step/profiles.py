"""Learned-profile floors: the largest bytes per token observed for a step.

A profile is keyed on everything about a step that changes what its activations hold
(``ProfileSignature``: the model, the layout, recompute, execution mode, the head, the
adapters, the CP comm, the dtype and whether it is the first step of its process), so a
floor observed for one step never raises another's. It is recorded from a measured peak
(``cpmem profile record``, ``record_profile``), may raise an estimate, never lower it,
and is trusted only up to 8x the token count it was observed at: beyond that, fixed
costs no longer dominate the same way and extrapolating a per-token figure is not
evidence. A pipeline stage's model chunk gets the whole step's floor scaled to its
share of the model's layers (``ProfileStore.scaled``).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpmem.errors import InputError

TRUSTED_GROWTH = 8


@dataclass(frozen=True)
class ProfileSignature:
    """What a profile is keyed on: every setting of a single-stage step that changes its
    activations (the tokens aside, which a profile scales with)."""

    model: str
    tp: int
    cp: int
    mode: str
    modules: str
    compiled: bool
    sp: bool = False
    ep: int = 1
    head: str = "logits"
    adapter: str = "lora r1"
    cp_comm: str = "all_gather"
    dtype_bytes: int = 2
    step: str = "steady"

    @property
    def key(self) -> str:
        c = "compiled" if self.compiled else "eager"
        return "|".join(
            (
                self.model,
                f"tp{self.tp}",
                f"cp{self.cp}",
                f"sp{int(self.sp)}",
                f"ep{self.ep}",
                self.mode,
                self.modules,
                c,
                f"head={self.head}",
                self.adapter,
                f"cp_comm={self.cp_comm}",
                f"dtype{self.dtype_bytes}",
                self.step,
            )
        )


KEY_FIELDS = 13
"""The fields of a profile's key (``ProfileSignature.key``)."""


@dataclass(frozen=True)
class Profile:
    bytes_per_token: float
    tokens: int


class ProfileStore:
    """A JSON-backed map from signature to its largest observed bytes per token."""

    def __init__(self, profiles: dict[str, Profile] | None = None) -> None:
        self._profiles: dict[str, Profile] = dict(profiles or {})

    def observe(self, signature: ProfileSignature, peak_bytes: int, tokens: int) -> None:
        """Record an observed peak; keep it only if it raises bytes per token."""
        if tokens < 1:
            raise InputError("tokens", tokens, "must be >= 1")
        if peak_bytes < 0:
            raise InputError("peak_bytes", peak_bytes, "must be >= 0")
        per_token = peak_bytes / tokens
        old = self._profiles.get(signature.key)
        if old is None or per_token > old.bytes_per_token:
            self._profiles[signature.key] = Profile(per_token, tokens)

    def floor(self, signature: ProfileSignature, tokens: int) -> int:
        """Bytes the profile vouches for at ``tokens``; 0 beyond 8x the observed tokens."""
        profile = self._profiles.get(signature.key)
        if profile is None or tokens > TRUSTED_GROWTH * profile.tokens:
            return 0
        return int(profile.bytes_per_token * tokens)

    def __len__(self) -> int:
        return len(self._profiles)

    def scaled(
        self, whole: ProfileSignature, chunk: ProfileSignature, share: float
    ) -> ProfileStore:
        """The store a pipeline chunk is priced with: the ``whole`` step's profile, if
        any, under the ``chunk``'s own signature, its bytes per token scaled by the
        chunk's ``share`` of the model's layers (a floor is what the layers held)."""
        profile = self._profiles.get(whole.key)
        if profile is None:
            return ProfileStore()
        return ProfileStore({chunk.key: Profile(profile.bytes_per_token * share, profile.tokens)})

    def to_json(self) -> dict[str, Any]:
        return {
            k: {"bytes_per_token": p.bytes_per_token, "tokens": p.tokens}
            for k, p in sorted(self._profiles.items())
        }

    @classmethod
    def load(cls, path: str | Path) -> ProfileStore:
        try:
            raw = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise InputError("profiles", str(path), "file not found") from None
        except json.JSONDecodeError as exc:
            raise InputError("profiles", str(path), f"not valid JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise InputError("profiles", str(path), "must hold a JSON object")
        profiles: dict[str, Profile] = {}
        for key, entry in raw.items():
            if not isinstance(key, str) or len(key.split("|")) != KEY_FIELDS:
                raise InputError(
                    f"profiles[{key!r}]",
                    entry,
                    f"is not a step's key ({KEY_FIELDS} fields joined by '|', as "
                    "`cpmem profile record` writes them); record the profile again",
                )
            try:
                profiles[key] = Profile(float(entry["bytes_per_token"]), int(entry["tokens"]))
            except (KeyError, TypeError, ValueError):
                raise InputError(
                    f"profiles[{key!r}]", entry, "needs bytes_per_token and tokens"
                ) from None
        return cls(profiles)

    def save(self, path: str | Path) -> None:
        """Write atomically: a crash leaves the old file, never a half-written one."""
        target = Path(path)
        if not target.parent.is_dir():
            raise InputError("profiles", str(path), "its directory does not exist")
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(self.to_json(), fh, indent=2, sort_keys=True)
            fh.write("\n")
        os.replace(tmp, target)
