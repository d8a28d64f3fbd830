"""The cold kernel set-up: what the first forward of a process allocates once.

One value for every policy and for the simulated tier (``cpmem.gate``), which adds it to
the rank simulator's peaks since the simulator does not model it.
"""

from __future__ import annotations

from cpmem.units import MIB

COLD_SETUP = 64 * MIB
"""Cold kernel set-up of the first forward of a process. Measured: the first forward
peak minus the repeat forward peak of the same cell is 64.0 MiB on 12 of the 16
first-in-process golden cells and 53.7-62.0 MiB on the other 4 (golden/README.md speaks
of "about 58 MiB"; the rank simulator's validation adds those 58 MiB, its own figure,
since an oracle imports nothing of cpmem: tests/oracle states the difference). The
upper value is priced: an estimate must cover every cell."""
