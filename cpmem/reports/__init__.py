"""What the suite writes for people to read: the gate's human report (``gate_render``),
the simulated tier's (``simulated_render``), ``cpmem report`` (``calibration``: every
golden cell's estimates and peaks, with figures), the ``tight`` policy's report
(``tight_report``), one table helper and formatters (``tables``), and the progress line of
the long commands (``progress``).

May import ``calibration`` and everything below it; never the gate, which calls it.
``tables`` needs the standard library only (the estimator's CLI prints with it); the rest need the
golden extra, which ``cpmem.cli`` checks before it loads any suite command.
"""
