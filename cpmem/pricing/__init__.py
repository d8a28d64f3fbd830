"""Bytes for a plan: the pricing inputs, the policy registry and the built-in policies.

May import ``cpmem.model`` and ``cpmem.plan``. Importing this package registers the
built-in policies (``reference``, ``global``, ``tight``); the registry itself imports
no policy, so there is no import circle.
"""

from cpmem.pricing import reference  # noqa: F401  (registers reference and global)
from cpmem.pricing.tight import policy  # noqa: F401  (registers tight)
