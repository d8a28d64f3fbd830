"""cpmem: per-rank activation-memory estimates for LoRA fine-tuning under TP/SP/CP."""

__version__ = "0.1.0"
