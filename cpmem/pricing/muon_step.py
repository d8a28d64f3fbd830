"""What Muon's optimizer step holds on top of the static memory: the Newton-Schulz
orthogonalisation of one matrix at a time.

At the recordings' snapshot (Megatron-LM d98e8a64, its pinned Emerging-Optimizers v0.3.0,
b309e2f0; the same code at 4828d651 with v0.2.0) ``OrthogonalizedOptimizer.step`` steps each fp32 master matrix in turn: its
decoupled weight decay and its momentum's update are in place, and without
``--muon-nesterov`` (Megatron-LM's default) the momentum itself is orthogonalised, then
added to the parameter in place; nothing outlives one matrix. ``TensorParallelMuon``'s
orthogonalisation of a local ``[r, c]`` fp32 matrix of ``N = r c`` elements, gathered over
its tensor-parallel group of ``T`` ranks (``--muon-tp-mode duplicated``, the default:
``newton_schulz_tp``; every Transformer Engine linear's weight has a ``partition_dim``,
TE b9d690e0 ``linear.py:1704-1709``, ``grouped_linear.py:1513-1524``; the routed experts
gather over the expert tensor-parallel group, ``expert_tp``), ``N_f = T N``
elements in the gathered matrix, ``s`` its smaller side:

- the gather: ``T`` received shards (``torch.empty_like``) and their ``torch.cat``, both
  held while Newton-Schulz runs: ``2 x 4 N_f``;
- ``newton_schulz`` under ``--muon-fp32-matmul-prec medium`` (the default: bf16 products):
  the normalised fp32 copy (``4 N_f``) and its bf16 cast (``2 N_f``) together, then per
  iteration ``X``, ``A = X X^T`` and ``B`` (``s x s`` each) and the new ``X``:
  ``2 (2 N_f + 2 s^2)``, then the bf16 result and its fp32 cast (``6 N_f``): the larger of
  ``6 N_f`` and ``4 N_f + 4 s^2`` (``newton_schulz_bytes``); the iteration count and the
  coefficients change no tensor;
- the scale (``orth_grad * scale_factor * extra_scale_factor``): the gathered result
  (``4 N_f``, the rank's chunk a view of it) and two local products (``2 x 4 N``).

With ``--muon-split-qkv`` (the default) the QKV projection (``is_qkv``: every
``linear_qkv.weight``, optimizer/__init__.py:777-797) is orthogonalised per part (query,
key, value; with the output gate two queries), one after another: its ``[groups, parts,
c]`` view is split, each part reshaped (a copy where the rank holds more than one query
group), each part's result kept until they are concatenated (``TensorParallelMuon.
orthogonalize``): at part ``i`` the copies (``4 N``), the results before it and part
``i``'s own orthogonalisation; at the end the results and their concatenation (``8 N``).

What the step holds is the largest of these over the matrices the rank steps
(``step_transient_bytes``). Two upper bounds: a rank's matrices are taken to be every
matrix of its stage (under the layer-wise distributed optimizer a rank steps its own whole
matrices, the busiest rank may hold the largest), and every matrix is taken to be split
over its group and gathered (a replicated one, the router's or the position table's, has
no ``partition_dim`` and is orthogonalised where it is), on the side that is not the
hidden size (``split_dims``), or where the shape does not say, the costlier side.

The other settings of the orthogonalisation (``--muon-nesterov``, ``--muon-tp-mode``
other than ``duplicated``, ``--muon-fp32-matmul-prec`` other than ``medium``,
``--muon-no-split-qkv``) change these tensors and are refused on the Megatron-LM door
(``cpmem.megatron.refused``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from cpmem.model.geometry import ModelGeometry
from cpmem.pricing.weights import stage_tensors
from cpmem.step.step import StepSettings

FP32 = 4
"""The master matrix, its momentum and the orthogonalisation's input and output."""
NS_BYTES = 2
"""Newton-Schulz's products under ``--muon-fp32-matmul-prec medium``: ``newton_schulz``
casts the normalised matrix to bf16 where ``torch.get_float32_matmul_precision()`` is
``medium`` (muon_utils.py at 1effa026)."""


def newton_schulz_bytes(rows: int, cols: int) -> int:
    """What ``newton_schulz`` allocates on an fp32 ``[rows, cols]`` matrix at its worst
    moment, in bf16 products: its normalised copy beside the bf16 cast (and the result
    beside its fp32 cast), or one iteration's ``X``, ``A``, ``B`` and new ``X``."""
    n, s = rows * cols, min(rows, cols)
    casts = FP32 * n + NS_BYTES * n
    iteration = NS_BYTES * (2 * n + 2 * s * s)
    return max(casts, iteration)


def orthogonalize_bytes(rows: int, cols: int, ranks: int, dim: int) -> int:
    """What ``scaled_orthogonalize_fn`` allocates on a local fp32 ``[rows, cols]`` matrix
    split on ``dim`` over ``ranks`` ranks (``--muon-tp-mode duplicated``): the gathered
    shards and their concatenation while Newton-Schulz runs on it, then the gathered
    result beside the two scaled local products."""
    full_rows, full_cols = (rows * ranks, cols) if dim == 0 else (rows, cols * ranks)
    local, full = rows * cols, full_rows * full_cols
    gathered = 2 * FP32 * full + newton_schulz_bytes(full_rows, full_cols)
    scaled = FP32 * full + 2 * FP32 * local
    return max(gathered, scaled)


def split_dims(rows: int, cols: int, ranks: int, hidden: int) -> tuple[int, ...]:
    """The side a local ``[rows, cols]`` matrix is split on over ``ranks``, as far as its
    shape says: a Transformer Engine linear reads or writes the hidden stream whole (a
    column-parallel one is ``[out / T, h]``, a row-parallel one ``[h, in / T]``), so the
    side that is not ``hidden`` is the split one; both where neither or both sides are."""
    if ranks > 1 and (rows == hidden) != (cols == hidden):
        return (1,) if rows == hidden else (0,)
    return (0, 1)


def matrix_bytes(rows: int, cols: int, ranks: int, hidden: int) -> int:
    """``orthogonalize_bytes`` of a local ``[rows, cols]`` matrix split over ``ranks``, on
    the larger of the sides ``split_dims`` leaves possible."""
    dims = split_dims(rows, cols, ranks, hidden)
    return max(orthogonalize_bytes(rows, cols, ranks, d) for d in dims)


def split_qkv_bytes(part_rows: Sequence[int], groups: int, cols: int, ranks: int) -> int:
    """The QKV projection orthogonalised part by part (``--muon-split-qkv``): ``part_rows``
    each part's rows per query group, ``groups`` the query groups on the rank, the
    projection column-parallel (split on its rows) over ``ranks``."""
    n = sum(part_rows) * groups * cols
    copies = FP32 * n if groups > 1 else 0  # reshape of a strided part copies it
    done, worst = 0, 0
    for rows in part_rows:
        part = rows * groups
        worst = max(worst, copies + done + orthogonalize_bytes(part, cols, ranks, 0))
        done += FP32 * part * cols
    return max(worst, 2 * FP32 * n)


def qkv_parts(g: ModelGeometry) -> tuple[int, ...]:
    """The QKV projection's parts per query group (``_get_qkv_split_shapes``,
    emerging_optimizers.py: the query's ``heads / groups x head_dim`` rows, twice with the
    output gate, then the key's and the value's ``head_dim``)."""
    q = g.q_width // g.kv_groups
    kv = g.kv_width // g.kv_groups
    return (q, q, kv, kv) if g.attention_output_gate else (q, kv, kv)


def _dense_bytes(g: ModelGeometry, shape: tuple[int, int], tp: int) -> int:
    rows, cols = shape
    whole = matrix_bytes(rows, cols, tp, g.hidden)
    parts = qkv_parts(g) if g.attention_layers and not g.is_mla else ()
    if parts and shape == (sum(parts) * g.kv_groups // tp, g.hidden):
        # the QKV projection's shape: split where it is the projection (an upper bound
        # where another matrix has its shape)
        whole = max(whole, split_qkv_bytes(parts, g.kv_groups // tp, g.hidden, tp))
    return whole


def _unshaped_bytes(elements: Iterable[int], ranks: int) -> int:
    """Matrices listed by element count only: ``s^2`` bounded by ``N``."""
    out = 0
    for n in elements:
        full = n * ranks
        iteration = NS_BYTES * 4 * full  # newton_schulz_bytes with s^2 at its bound N_f
        out = max(out, 2 * FP32 * full + iteration, FP32 * full + 2 * FP32 * n)
    return out


def step_transient_bytes(settings: StepSettings, stage: int) -> int:
    """The largest orthogonalisation of a matrix Muon steps on pipeline ``stage`` (0
    where the step is not Muon's or trains adapters)."""
    opt = settings.optimizer
    if opt.kind != "muon" or settings.training != "full":
        return 0
    g, layout, pipe = settings.geometry, settings.layout, settings.pipeline
    layers = [i for c in range(pipe.vpp) for i in pipe.chunk_layers(g.layers, stage, c)]
    t = stage_tensors(g, layout, layers, first=stage == 0, last=stage == pipe.pp - 1)
    if t.dense_shapes is None:
        dense = _unshaped_bytes(
            (n for n, m in zip(t.dense, t.dense_matrices, strict=True) if m), layout.tp
        )
    else:
        dense = max((_dense_bytes(g, s, layout.tp) for s in t.dense_shapes), default=0)
    experts = max((matrix_bytes(r, c, layout.etp, g.hidden) for r, c in t.expert_shapes), default=0)
    return max(dense, experts)
