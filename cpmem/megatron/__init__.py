"""Megatron-LM's own arguments, read into the one step description.

``args`` reads Megatron-LM's arguments (a functional test's ``model_config.yaml`` or a
flags file) with Megatron-LM's defaults, each flag priced, ignored or refused;
``describe`` turns them into ``describe_step``'s keywords (the model, the layout, the
recompute setting, the process, the request) and the ``Step`` every caller prices: the
API, the CLI's ``estimate``, ``admit`` and ``capacity``, and the gate's measured tier.
Nothing here prices: a Megatron-LM run is priced by the policies, layer kind by layer
kind, as any step is.
"""
