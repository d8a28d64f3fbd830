"""What a model is: its geometry, the built-in presets, Hugging Face configs.

Imports nothing else of cpmem but ``errors``.
"""
