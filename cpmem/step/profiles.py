"""Learned-profile floors: the largest bytes per token observed for a step.

A profile is keyed on everything about a step that changes what its activations hold
(``ProfileSignature``: the model, the layout, recompute, execution mode, the head, the
adapters, the CP comm, the dtype and whether it is the first step of its process), so a
floor observed for one step never raises another's. It is recorded from a measured peak
(``cpmem profile record``, ``record_profile``) under the step's own key, may raise an
estimate, never lower it, and is trusted only up to 8x the token count it was observed
at: beyond that, fixed costs no longer dominate the same way and extrapolating a
per-token figure is not evidence. A pipeline stage's model chunk gets the whole step's
floor scaled to its share of the model's layers (``ProfileStore.scaled``).

A policy looks a step's floor up on what it prices: the key's fields that are options
it does not price (``OPTION_FIELDS``, named on its estimates as ignored) are not
compared (``ProfileStore.floor``'s ``ignoring``), so a profile observed eager floors the
compiled step alike where the policy prices the two alike, and the option cannot change
which profile applies. The stored keys are the steps' own: a store stays readable
whichever policy reads it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
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
    def parts(self) -> dict[str, str]:
        """Each field's part of the key, by field name."""
        return {
            "model": self.model,
            "tp": f"tp{self.tp}",
            "cp": f"cp{self.cp}",
            "sp": f"sp{int(self.sp)}",
            "ep": f"ep{self.ep}",
            "mode": self.mode,
            "modules": self.modules,
            "compiled": "compiled" if self.compiled else "eager",
            "head": f"head={self.head}",
            "adapter": self.adapter,
            "cp_comm": f"cp_comm={self.cp_comm}",
            "dtype_bytes": f"dtype{self.dtype_bytes}",
            "step": self.step,
        }

    @property
    def key(self) -> str:
        return "|".join(self.parts.values())


KEY_ORDER = tuple(ProfileSignature("", 0, 0, "", "", False).parts)
"""The ``ProfileSignature`` field each of a key's ``|``-joined parts holds, in order."""

KEY_FIELDS = len(KEY_ORDER)
"""The fields of a profile's key (``ProfileSignature.key``)."""

OPTION_FIELDS: dict[str, tuple[str, ...]] = {
    "compiled": ("compiled",),
    "recompute": ("mode", "modules"),
    "cp_comm": ("cp_comm",),
}
"""The step options a policy may leave unpriced (``cpmem.pricing.registry.SETTABLE``)
that a key holds, each with its fields: a policy that does not price one looks a profile
up across those fields' values (``ProfileStore.floor``)."""


def _masked(key: str, ignoring: Collection[str]) -> tuple[str, ...]:
    """``key``'s parts with the fields of the options in ``ignoring`` blanked (options
    the key does not hold blank nothing)."""
    blank = {f for option in ignoring for f in OPTION_FIELDS.get(option, ())}
    return tuple(
        "" if name in blank else part for name, part in zip(KEY_ORDER, key.split("|"), strict=True)
    )


@dataclass(frozen=True)
class Profile:
    bytes_per_token: float
    tokens: int


class ProfileStore:
    """A JSON-backed map from signature to its largest observed bytes per token."""

    def __init__(self, profiles: dict[str, Profile] | None = None) -> None:
        self._profiles: dict[str, Profile] = dict(profiles or {})
        for key in self._profiles:
            if len(key.split("|")) != KEY_FIELDS:
                raise InputError(
                    f"profiles[{key!r}]",
                    key,
                    f"is not a step's key ({KEY_FIELDS} fields joined by '|': "
                    "ProfileSignature.key); it would floor no step",
                )

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

    def floor(
        self, signature: ProfileSignature, tokens: int, ignoring: Collection[str] = ()
    ) -> int:
        """Bytes the store vouches for at ``tokens`` for the step ``signature`` keys: the
        largest floor of the profiles observed for it, each trusted up to 8x the tokens
        it was observed at (0 where none is). ``ignoring``: the options the pricing
        policy does not price for the step; the key's fields among them are not
        compared, so every profile that differs from the step only there applies."""
        if not set(ignoring) & set(OPTION_FIELDS):
            found = self._profiles.get(signature.key)
            candidates = [] if found is None else [found]
        else:
            wanted = _masked(signature.key, ignoring)
            candidates = [p for k, p in self._profiles.items() if _masked(k, ignoring) == wanted]
        trusted = [p for p in candidates if tokens <= TRUSTED_GROWTH * p.tokens]
        return max((int(p.bytes_per_token * tokens) for p in trusted), default=0)

    def __len__(self) -> int:
        return len(self._profiles)

    def scaled(
        self, whole: ProfileSignature, chunk: ProfileSignature, share: float
    ) -> ProfileStore:
        """The store a pipeline chunk is priced with: the profiles of the ``whole`` step,
        whatever their ``OPTION_FIELDS`` (the chunk's policy decides which of those it
        compares), each under the ``chunk``'s own signature with its own option fields,
        its bytes per token scaled by the chunk's ``share`` of the model's layers (a
        floor is what the layers held)."""
        wanted = _masked(whole.key, OPTION_FIELDS)
        ours = chunk.key.split("|")
        out: dict[str, Profile] = {}
        for key, profile in self._profiles.items():
            if _masked(key, OPTION_FIELDS) != wanted:
                continue
            held = {f for fields in OPTION_FIELDS.values() for f in fields}
            parts = [
                stored if name in held else own
                for name, own, stored in zip(KEY_ORDER, ours, key.split("|"), strict=True)
            ]
            out["|".join(parts)] = Profile(profile.bytes_per_token * share, profile.tokens)
        return ProfileStore(out)

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
        import tempfile  # only a store being saved needs it

        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(self.to_json(), fh, indent=2, sort_keys=True)
            fh.write("\n")
        os.replace(tmp, target)
