"""Independent oracles for cpmem's reference widths; they never import cpmem (see README.md)."""
