"""Typed access to a Hugging Face ``config.json``'s fields: every failure names the field
and its value (``ConfigError``)."""

from __future__ import annotations

from typing import Any

from cpmem.errors import ConfigError


class Fields:
    """Typed field access that names the field on every failure."""

    def __init__(self, text: dict[str, Any]) -> None:
        self.text = text

    def int(
        self,
        key: str,
        default: int | None = None,
        root: dict[str, Any] | None = None,
        nullable: bool = False,
    ) -> int:
        """The field as a non-negative int; ``default`` where it is absent (or, when
        ``nullable``, null)."""
        present = key in self.text
        value = self.text.get(key)
        if value is None and root is not None:
            present, value = key in root, root.get(key)
        if value is None:
            if default is not None and (not present or nullable):
                return default
            raise ConfigError(key, None, "missing from config")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(key, value, "must be a non-negative integer")
        return value


def flag(fields: dict[str, Any], key: str, default: bool) -> bool:
    """A true/false field; ``default`` where it is absent or null."""
    value = fields.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(key, value, "must be true or false")
    return value
