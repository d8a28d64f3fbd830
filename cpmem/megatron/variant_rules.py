"""Megatron-LM's rules on the layer variants gpt-oss's launch flags select, and what of
them cpmem does not price.

- Quick GeGLU (``--quick-geglu``): a gated MLP of ``quick_gelu`` (argument_utils.py:
  323-326, asserting ``not args.swiglu``), whose bias-activation fusion follows
  ``--bias-gelu-fusion`` (argument_utils.py:318-319), which validate_args turns off under
  ``--disable-bias-linear`` (arguments.py:1605-1606). Unfused, the experts run
  ``experts.py``'s GLU (998-1011 at the snapshot): the priced ``activation_clamp`` row set
  (``cpmem.pricing.kinds.moe.CLAMPED_GLU_ROW_F``) with a clamp, the eager GLU's without.
  Fused (``weighted_bias_quick_geglu_impl``, fused_bias_geglu.py) it keeps another set,
  not priced; nor is a dense MLP's quick GeGLU (this door prices dense MLPs fused). The
  offset (``--glu-linear-offset``) is added whatever its value, so it prices nothing; the
  clamp (``--activation-func-clamp-value``) is read only with quick GeGLU.
- The softmax (``--softmax-type``): ``learnable`` is a sink logit per head (a parameter,
  ``ModelGeometry.attention_sinks``) and Transformer Engine's backend selection under it
  (``Runtime.softmax_type``); ``off-by-one`` is not priced, nor either softmax in the
  local implementation's attention.
- The router's z-loss (``--moe-z-loss-coeff``) is priced wherever it is given
  (``ModelGeometry.router_z_loss_bytes``); nothing here refuses it.
"""

from __future__ import annotations

from cpmem.megatron.fields import MegatronArgs
from cpmem.megatron.stack import hybrid_pattern, moe_layers

Problem = tuple[str, str]
UNPRICED = "changes memory cpmem does not price: "
REJECTS = "Megatron-LM rejects it: "


def quick_geglu_fused(args: MegatronArgs) -> bool:
    """Whether quick GeGLU runs megatron-core's fused bias-activation: ``--bias-gelu-fusion``
    (on unless ``--no-bias-gelu-fusion``) and linear biases (arguments.py:1605-1606)."""
    return args.add_bias_linear and "--no-bias-gelu-fusion" not in args.flag_values


def _quick_geglu_problems(args: MegatronArgs) -> list[Problem]:
    out: list[Problem] = []
    clamp = args.activation_func_clamp_value
    if not args.quick_geglu:
        if clamp is not None:
            out.append(
                (
                    f"--activation-func-clamp-value {clamp:g}",
                    UNPRICED + "a clamped activation other than quick GeGLU's (read only "
                    "with --quick-geglu)",
                )
            )
        if args.glu_linear_offset != 0.0:
            out.append(
                (
                    f"--glu-linear-offset {args.glu_linear_offset:g}",
                    UNPRICED + "a GLU offset on an activation other than quick GeGLU "
                    "(read only with --quick-geglu)",
                )
            )
        return out
    if args.swiglu:
        out.append(
            ("--quick-geglu --swiglu", REJECTS + "assert not args.swiglu (argument_utils.py:324)")
        )
    if args.squared_relu:
        out.append(
            (
                "--quick-geglu --squared-relu",
                "name two activations: Megatron-LM builds squared ReLU and drops quick GeGLU "
                "(argument_utils.py:320-323); give one",
            )
        )
    if clamp is not None and not clamp > 0:
        out.append(
            (f"--activation-func-clamp-value {clamp:g}", "must be > 0 (a clamp of both halves)")
        )
    if quick_geglu_fused(args):
        out.append(
            (
                "--quick-geglu with linear biases and --bias-gelu-fusion",
                UNPRICED + "the fused bias + quick GeGLU (weighted_bias_quick_geglu_impl: "
                "the experts save the clamped halves' 2F-wide concatenation beside fc1's "
                "output, fused_bias_geglu.py); --no-bias-gelu-fusion or --disable-bias-"
                "linear runs the unfused GLU priced",
            )
        )
    if hybrid_pattern(args) is not None or not all(moe_layers(args)):
        out.append(
            (
                "--quick-geglu with dense MLP layers",
                UNPRICED + "quick GeGLU in a dense MLP or a hybrid stack (priced in the "
                "experts of a GPT stack whose every layer is an MoE layer)",
            )
        )
    return out


def _softmax(args: MegatronArgs) -> list[Problem]:
    kind = args.softmax_type
    if kind == "vanilla":
        return []
    flag = f"--softmax-type {kind}"
    if kind != "learnable":
        return [(flag, UNPRICED + "the off-by-one softmax (Transformer Engine's offset 0)")]
    if args.transformer_impl == "local":
        return [
            (
                f"{flag} --transformer-impl local",
                UNPRICED + "the local attention's learnable softmax (its sinks concatenated "
                "onto the scores, dot_product_attention.py)",
            )
        ]
    if args.attention_backend == "flash":
        return [
            (
                f"{flag} --attention-backend flash",
                "Transformer Engine turns FlashAttention off under a softmax other than "
                "vanilla (utils.py:708-710 at TE v2.11) and --attention-backend flash turns "
                "the other backends off: no backend is left",
            )
        ]
    return []


def variant_problems(args: MegatronArgs) -> list[Problem]:
    """Every rule of the quick GeGLU and softmax flags ``args`` break."""
    return _quick_geglu_problems(args) + _softmax(args)
