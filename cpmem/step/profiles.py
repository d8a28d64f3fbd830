"""Learned-profile floors: the largest bytes per token observed for a plan signature.

A floor may raise an estimate, never lower it, and is trusted only up to 8x the
token count it was observed at: beyond that, fixed costs no longer dominate the
same way and extrapolating a per-token figure is not evidence.
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
    model: str
    tp: int
    cp: int
    mode: str
    modules: str
    compiled: bool

    @property
    def key(self) -> str:
        c = "compiled" if self.compiled else "eager"
        return f"{self.model}|tp{self.tp}|cp{self.cp}|{self.mode}|{self.modules}|{c}"


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
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(self.to_json(), fh, indent=2, sort_keys=True)
            fh.write("\n")
        os.replace(tmp, target)
