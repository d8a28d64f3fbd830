"""Gated DeltaNet mixing: fla's fused kernel where installed, else a pure-torch fallback.

Why the fallback: the lent GPU image has no flash-linear-attention, and hybrid models
must still run. The fallback is checked against the token-by-token recurrence (on CPU,
in tests/unit/test_driver_cli.py). It keeps more for backward than fla's kernel does,
so measuring with it would overstate a peak. ``count_saved`` (what autograd saved
inside the fallback) minus ``fla_equivalent_saved_bytes`` (what fla's kernel saves for
the same call, counted the same way) is ``gdn_fallback_saved_bytes``: the driver
reports it, and the GPU checks subtract it from the peaks, never more.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from .torchlib import load_torch

GDN_CHUNK = 64
# fla's chunk length (BT) in chunk_gated_delta_rule: the width of the matrix A it saves.
FLA_CHUNK = 64


def have_fla() -> bool:
    """Whether flash-linear-attention's fused chunked gated-delta-rule kernel is importable."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: F401
    except Exception:
        return False
    return True


def gdn_reference_recurrent(
    q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any
) -> tuple[Any, Any]:
    """Token-by-token gated delta rule (fp32), the definition the chunked form must match.

    Shapes: q, k [T, H, dk] (already L2-normalised and scaled), v [T, H, dv], g and beta
    [T, H], state [H, dk, dv]. S_t = a_t S + k_t (beta_t (v_t - a_t S^T k_t))^T; o_t = S_t^T q_t.
    """
    torch = load_torch()
    s = state.float()
    outs = []
    for t in range(q.shape[0]):
        s = s * torch.exp(g[t].float())[:, None, None]
        kt, vt = k[t].float(), v[t].float()
        u = beta[t].float()[:, None] * (vt - torch.einsum("hkv,hk->hv", s, kt))
        s = s + kt[:, :, None] * u[:, None, :]
        outs.append(torch.einsum("hkv,hk->hv", s, q[t].float()))
    return torch.stack(outs), s


def gdn_chunked_torch(
    q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any, chunk: int = GDN_CHUNK
) -> tuple[Any, Any]:
    """Pure-torch chunked gated delta rule (fp32), the fallback when fla is missing.

    Per chunk with start state S0, cumulative log-decay G and Gamma_ti = exp(G_t - G_i):
    U = A^-1 diag(beta)(V - diag(e^G) K S0) with A = I + diag(beta)(strict_tril(KK^T) * Gamma);
    O = diag(e^G) Q S0 + (tril(QK^T) * Gamma) U; S = e^{G_C} S0 + (K * e^{G_C - G})^T U.
    It saves more for backward than the fused kernel (every chunk's S0, Gamma, A, U, in
    fp32); the driver reports those bytes separately instead of passing them off as fla's.
    """
    torch = load_torch()
    s = state.float()
    outs = []
    for a in range(0, q.shape[0], chunk):
        qc = q[a : a + chunk].float().transpose(0, 1)  # [H, C, dk]
        kc = k[a : a + chunk].float().transpose(0, 1)
        vc = v[a : a + chunk].float().transpose(0, 1)  # [H, C, dv]
        bc = beta[a : a + chunk].float().transpose(0, 1)  # [H, C]
        gc_ = torch.cumsum(g[a : a + chunk].float().transpose(0, 1), dim=-1)
        c = qc.shape[1]
        lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
        diff = (gc_[:, :, None] - gc_[:, None, :]).masked_fill(~lower, float("-inf"))
        gamma = torch.exp(diff)
        strict = lower.logical_and(~torch.eye(c, dtype=torch.bool, device=q.device))
        kk = (kc @ kc.transpose(-1, -2)) * gamma * strict
        amat = torch.eye(c, device=q.device) + bc[:, :, None] * kk
        decay = torch.exp(gc_)[:, :, None]
        rhs = bc[:, :, None] * (vc - decay * (kc @ s))
        u = torch.linalg.solve_triangular(amat, rhs, upper=False, unitriangular=True)
        out = decay * (qc @ s) + ((qc @ kc.transpose(-1, -2)) * gamma) @ u
        tail = torch.exp(gc_[:, -1:] - gc_)[:, :, None]
        s = torch.exp(gc_[:, -1])[:, None, None] * s + (kc * tail).transpose(-1, -2) @ u
        outs.append(out.transpose(0, 1))
    return torch.cat(outs), s


def gdn_kernel(q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any) -> tuple[Any, Any]:
    """fla's fused kernel where installed (it L2-normalises and scales q, k itself), else
    the pure-torch chunked fallback on explicitly normalised inputs."""
    torch = load_torch()
    if q.is_cuda and have_fla():
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        o, final = chunk_gated_delta_rule(
            q[None], k[None], v[None], g[None].float(), beta[None],
            initial_state=state[None].float(), output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        return o[0], final[0]
    f = torch.nn.functional
    qn = f.normalize(q.float(), dim=-1) * q.shape[-1] ** -0.5
    kn = f.normalize(k.float(), dim=-1)
    o, final = gdn_chunked_torch(qn, kn, v, g, beta, state)
    return o.to(v.dtype), final


def fla_equivalent_saved_bytes(
    q: Any, k: Any, v: Any, beta: Any, state: Any, seen: set[int]
) -> int:
    """What fla's ``chunk_gated_delta_rule`` would save for backward on this call, counted
    the way ``count_saved`` counts what the fallback saved (each storage once per GDN
    layer call, by its full size; ``seen`` holds the storages already counted).

    Not a measurement: it follows fla-core 0.6.0's ``ChunkGatedDeltaRuleFunction``
    (``use_qk_l2norm_in_kernel=True``, gate and beta sigmoid outside the kernel), whose
    ``save_for_backward`` keeps new tensors q and k after its L2 norm ([T, H, dk], q's
    dtype), their fp32 rstd ([T, H] each), the fp32 chunk-local cumulative gate
    ([T, H]) and the solved chunk matrix A ([T, H, 64], k's dtype); and v, beta and the
    initial state as passed, which its ``input_guard`` first makes contiguous: a
    contiguous view keeps its whole storage, a strided one becomes a new copy.
    """
    t, h, dk = q.shape
    new: int = 2 * t * h * dk * q.element_size()  # q, k after the in-kernel L2 norm
    new += 3 * t * h * 4  # q_rstd, k_rstd, cumulative gate g: fp32
    new += t * h * FLA_CHUNK * k.element_size()  # A
    for x in (v, beta, state):
        if not x.is_contiguous():
            new += int(x.numel() * x.element_size())
            continue
        st = x.untyped_storage()
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            new += int(st.nbytes())
    return new


@contextlib.contextmanager
def count_saved(sink: list[int]) -> Iterator[None]:
    """Add the bytes autograd saves inside the block (each storage once, no parameters)."""
    torch = load_torch()
    seen: set[int] = set()
    total = [0]

    def pack(t: Any) -> Any:
        st = t.untyped_storage()
        key = st.data_ptr()
        if not isinstance(t, torch.nn.Parameter) and key not in seen:
            seen.add(key)
            total[0] += st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield
    sink.append(total[0])
