"""Megatron-LM's flex token dispatcher (``--moe-token-dispatcher-type flex``): which of
its backends cpmem prices, and on what terms.

megatron-core's ``MoEFlexTokenDispatcher`` (Megatron-LM d98e8a64,
``megatron/core/transformer/moe/token_dispatcher.py:1809-1870``) runs one of three
backends, ``--moe-flex-dispatcher-backend`` (default ``deepep``,
``transformer_config.py:898``):

- ``hybridep`` is priced (``Runtime.moe_dispatcher`` ``hybridep``,
  ``cpmem.pricing.kinds.moe_dispatch``): at expert TP 1, with an fp32 router, dropless.
  Above expert TP 1 ``_initialize_metadata`` expands the routing map and probabilities over
  the ETP group into copies (token_dispatcher.py:1893-1919); with a bf16 router the
  manager keeps an fp32 copy of the probabilities beside them (``token_probs.float()``,
  :1136-1141); with a capacity factor the permuted rows are HybridEP's fixed budget
  (:1098-1127). None of these is checked against a recording, so each is refused.
- ``deepep``: DeepEP's fused dispatch returns the received tokens in the source ranks'
  order with a handle of its own (``is_token_in_rank``, the prefix matrices,
  ``recv_src_idx``, ``send_head``; fused_a2a.py:72-210), and megatron then permutes them
  (``_DeepepManager.get_permuted_hidden_states_by_experts``, :1424-1458): a saved set cpmem
  has not read. Refused.
- ``ncclep``: NCCL EP's dispatch into a registered receive buffer it grows at run time
  (``_NCCLEPManager``, :1471-1808), refused.
"""

from __future__ import annotations

from cpmem.megatron.fields import MegatronArgs

Problem = tuple[str, str]
PRICED_BACKEND = "hybridep"
UNPRICED = "changes memory cpmem does not price: "


def flex_dispatcher(args: MegatronArgs) -> str:
    """The dispatcher ``Runtime.moe_dispatcher`` names for ``args``: ``hybridep`` for the
    flex dispatcher (whose other backends ``flex_problems`` refuses), else the type."""
    if args.moe_token_dispatcher_type == "flex":
        return PRICED_BACKEND
    return args.moe_token_dispatcher_type


def flex_problems(args: MegatronArgs) -> list[Problem]:
    """What of the flex dispatcher ``args`` asks for is not priced (none where the run
    uses another dispatcher)."""
    if args.moe_token_dispatcher_type != "flex" or not args.num_experts:
        return []
    backend = args.moe_flex_dispatcher_backend
    flag = f"--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend {backend}"
    if backend == "deepep":
        return [
            (
                flag,
                UNPRICED + "DeepEP's handle (is_token_in_rank, the prefix matrices, "
                "recv_src_idx, send_head) and megatron's permutation of the received tokens "
                "after it (token_dispatcher.py:1225-1470); priced: the hybridep backend",
            )
        ]
    if backend != PRICED_BACKEND:
        return [
            (
                flag,
                UNPRICED + "NCCL EP's registered receive buffer, grown at run time "
                "(_NCCLEPManager); priced: the hybridep backend",
            )
        ]
    out: list[Problem] = []
    etp = args.expert_tensor_parallel_size or args.tensor_model_parallel_size
    if etp > 1:
        out.append(
            (
                f"{flag} with --expert-tensor-parallel-size {etp}",
                UNPRICED + "the routing map and probabilities expanded over the expert-TP "
                "group into copies (_initialize_metadata, token_dispatcher.py:1893-1919); "
                "priced at expert TP 1",
            )
        )
    if args.moe_router_dtype != "fp32":
        out.append(
            (
                f"{flag} without --moe-router-dtype fp32",
                UNPRICED + "the fp32 copy of the probabilities HybridEP takes "
                "(token_probs.float(), token_dispatcher.py:1136-1141)",
            )
        )
    capacity = args.moe_expert_capacity_factor
    if capacity is not None and capacity >= 0:
        out.append(
            (
                f"{flag} with --moe-expert-capacity-factor {capacity:g}",
                UNPRICED + "HybridEP's rows sized to the capacity (num_permuted_tokens, "
                "token_dispatcher.py:1114-1127); priced dropless",
            )
        )
    return out
