"""The code of the golden data layer (the data itself stays in the top-level ``golden/``).

Schema, loading and validating cells, importing sources, the sha256 manifest.
Imports nothing of the estimator: the data layer does not price.
"""
