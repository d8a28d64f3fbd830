"""The code of the golden data layer (the data itself stays in the top-level ``golden/``).

Schema (a pandera DataFrameModel), loading and validating cells as DataFrames,
importing sources, the sha256 manifest. Imports nothing of the estimator: the data
layer does not price. It needs pandas and pandera (the ``golden`` extra); without
them importing it stops with one line naming the extra.
"""

from cpmem.errors import CpmemError

GOLDEN_EXTRA_HINT = "pip install 'cpmem[golden]'"


class MissingExtraError(CpmemError, ImportError):
    """An optional dependency of the suite's machinery is not installed."""


try:
    import pandas  # noqa: F401
    import pandera  # noqa: F401
except ImportError as _exc:
    raise MissingExtraError(
        f"the golden data layer needs pandas and pandera ({_exc.name or 'one of them'} is "
        f"not installed): {GOLDEN_EXTRA_HINT}"
    ) from None
