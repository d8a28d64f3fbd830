"""The second measured runtime: Megatron-LM's own GPT training runs.

``args`` reads Megatron-LM's arguments (a functional test's ``model_config.yaml`` or a
flags file) with Megatron-LM's defaults; ``run`` describes the run on one named rank
(``describe_megatron_run``, the one description every caller prices: the API, the CLI's
``estimate``, ``admit`` and ``capacity``, and the gate's measured tier); ``static``,
``activations`` and ``estimate`` price it: the bytes left allocated between steps and
the allocator's peak over a steady step. Full-parameter training, an LM head and its
loss, an optimizer step: nothing here reads the LoRA estimator's step.
"""
