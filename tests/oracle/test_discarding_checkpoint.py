"""megatron-core's output-discarding checkpoint (``tensor_parallel.CheckpointWithoutOutput``,
which the ``layernorm``, ``moe_act`` and ``mla_up_proj`` recompute modules run) on small
CPU tensors: the fact ``cpmem.pricing.kinds.discarded`` prices, that what backward keeps
of a discarded module is its inputs alone. The module's own saved set is not made, and
its output's storage is freed even where the consumer saved it (or a view of it), then
rebuilt before the consumer's backward, which gives the same gradients.

Measured here with megatron-core's own class (the venv's 0.16, whose ``random.py`` is the
recordings' snapshot's in these functions), the tensors autograd keeps counted by their
storages after the forward; nothing of cpmem is imported. The checkpoint's RNG states
are the CPU generator's alone (no CUDA here), and ``fp8=None`` turns its FP8 path off
(``self.fp8 = fp8 is not None``: megatron's own calls run it under Transformer Engine)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")
rnd = pytest.importorskip("megatron.core.tensor_parallel.random")

N, H, F = 32, 64, 48


@pytest.fixture(autouse=True)
def _cpu_rng(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rnd, "_get_all_rng_states", lambda: (torch.get_rng_state(),))
    monkeypatch.setattr(rnd, "_set_all_rng_states", lambda cpu: torch.set_rng_state(cpu))


def _held(
    module: Callable[..., torch.Tensor],
    consumer: Callable[[torch.Tensor], torch.Tensor],
    inputs: tuple[torch.Tensor, ...],
    discard: bool,
) -> tuple[int, list[torch.Tensor]]:
    """Bytes of the distinct storages autograd keeps after ``consumer(module(*inputs))``,
    and the inputs' gradients after its backward."""
    saved: list[torch.Tensor] = []
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        if discard:
            ck = rnd.CheckpointWithoutOutput(fp8=None)
            out = ck.checkpoint(module, *leaves)
        else:
            out = module(*leaves)
        result = consumer(out)
        if discard:
            ck.discard_output_and_register_recompute(result)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in saved}
    held = sum(storages.values())
    result.sum().backward()
    return held, [t.grad for t in leaves]  # type: ignore[misc]


def _check(
    module: Callable[..., torch.Tensor],
    consumer: Callable[[torch.Tensor], torch.Tensor],
    inputs: tuple[torch.Tensor, ...],
    consumer_own: int,
) -> None:
    """With the discard, backward keeps the consumer's own tensors (``consumer_own``
    bytes: its weights) and the module's inputs, nothing of what the module made; the
    gradients are the plain run's."""
    plain, grads = _held(module, consumer, inputs, discard=False)
    kept, recomputed = _held(module, consumer, inputs, discard=True)
    assert kept == consumer_own + sum(t.untyped_storage().nbytes() for t in inputs)
    assert kept < plain
    for a, b in zip(grads, recomputed, strict=True):
        torch.testing.assert_close(a, b)


def test_a_norms_output_is_freed_though_the_linear_after_it_saved_it() -> None:
    # ``layernorm``: the norm's output is the next linear's saved input
    weight = torch.randn(3 * H, H)

    def rmsnorm(x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    _check(
        rmsnorm, lambda y: y @ weight.t(), (torch.randn(N, H),), weight.untyped_storage().nbytes()
    )


def test_the_activation_keeps_only_fc1s_output_and_the_probabilities() -> None:
    # ``moe_act``: the probs-weighted SwiGLU between the experts' fc1 and fc2
    fc2 = torch.randn(H, F, requires_grad=True)

    def act(fc1_out: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        gate, up = fc1_out.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up * probs

    inputs = (torch.randn(N, 2 * F), torch.rand(N, 1))
    _check(act, lambda y: y @ fc2.t(), inputs, fc2.untyped_storage().nbytes())


def test_the_up_projections_outputs_are_freed_though_the_core_saved_views_of_them() -> None:
    # ``mla_up_proj``: the up projection and the query/key concatenation; the core's
    # ``baddbmm``/``bmm`` save transposed views of q, k and v
    heads, d = 4, 8
    up = torch.randn(3 * heads * d, 16)

    def up_proj(compressed: torch.Tensor) -> torch.Tensor:
        q, k, v = (compressed @ up.t()).view(N, 3, heads, d).unbind(1)
        return torch.stack([q, k, v.contiguous()], dim=0)

    def core(qkv: torch.Tensor) -> torch.Tensor:
        q, k, v = qkv.transpose(1, 2).unbind(0)  # [heads, N, d] views
        scores = torch.baddbmm(torch.zeros(heads, N, N), q, k.transpose(1, 2))
        return torch.bmm(scores, v).sum(0)

    # the scores' ``bmm`` saves its [heads, N, N] input: the core's own tensor
    _check(up_proj, core, (torch.randn(N, 16),), heads * N * N * 4)
