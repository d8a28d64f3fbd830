"""The attention backend Transformer Engine runs for a Megatron-core GPT training step.

Under ``--attention-backend auto`` Megatron-core leaves the choice to Transformer Engine's
``DotProductAttention``, which calls ``get_attention_backend``
(``transformer_engine/pytorch/attention/dot_product_attention/utils.py``, "utils.py"
below) on its first forward. This module restates that rule, for the arguments a
Megatron-core run gives it, as of TE v2.11 (the newest megatron-core 0.16 allows:
``transformer-engine>=2.9.0a0,<2.12.0``, pyproject.toml:71 at core_v0.16.1), with the
places where v2.9 and v2.10 differ. Every line number cited is at v2.11 unless a version
is named. The rule, in TE's order:

1. ``NVTE_FLASH_ATTN`` / ``NVTE_FUSED_ATTN`` / ``NVTE_UNFUSED_ATTN`` (utils.py:407-412).
   Megatron-core sets all three from ``--attention-backend`` (``_set_attention_backend``,
   language_module.py:92-126 in megatron-core 0.16.1): ``auto`` leaves all on, ``flash``
   / ``fused`` / ``unfused`` turn the other two off; a variable already set to another
   value fails its assertion (language_module.py:102).
2. Filters, each turning a backend off: compute capability (flash 2 and fused need
   sm80+, flash 3 exactly sm90), dtype (flash and fused need bf16/fp16), the query's max
   logit, head dimensions, the THD format, dropout (flash 3), softmax type, context
   parallelism (unfused never runs under CP), the causal mask's s_q = s_kv, the sliding
   window, cuDNN's own support (``nvte_get_fused_attn_backend``,
   ``transformer_engine/common/fused_attn/fused_attn.cpp``, "fused_attn.cpp" below), and
   determinism (flash 2 below 2.4.1; fused below sm90 or on sm100+).
3. What is installed: flash-attn 2 within TE's version gate (backends.py:91-100), the
   ``flash-attn-3`` package (backends.py:133-151); flash 3 is preferred over flash 2
   (utils.py:1114-1117).
4. Priority: fused over flash on sm90 and newer (utils.py:1133-1139), else flash, then
   fused, then unfused (utils.py:1141-1146); none left raises at the first forward
   (dot_product_attention.py:1395-1401).

The fused backend's sub-backend is always ``F16_arbitrary_seqlen`` for Megatron's
tensors: the ``F16_max512_seqlen`` sub-backend takes only the sb3hd, sbhd_sb2hd, bs3hd,
bshd_bs2hd and bshd_bshd_bshd layouts (fused_attn.cpp:280-284), and Megatron hands TE
views of its QKV projection (sbh3d with MHA) or separate tensors (sbhd_sbhd_sbhd, thd_thd_thd),
as ``get_qkv_layout`` names them (utils.py:1976-2008). So ``NVTE_FUSED_ATTN_BACKEND``
changes nothing here (fused_attn.cpp:455-462 applies it only to a sub-backend whose flag
holds). Not restated (Megatron GPT training does not reach them): FP8 attention, attention
bias, ALiBi, KV caching, CUDA-graph capture, ``num_splits``, inference.

Which backend runs depends on the container (TE version, flash-attn, cuDNN), so a
selection also reports its ``spread`` over ``CONTAINERS``, every container this module
considers plausible for megatron-core 0.16, and what no container runs (``refused``).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from cpmem.errors import InputError, require_positive_int

Backend = Literal["flash", "fused", "unfused"]
BACKENDS: tuple[Backend, ...] = ("flash", "fused", "unfused")
TE_VERSIONS = ((2, 9), (2, 10), (2, 11))
MEGATRON_BACKENDS = ("auto", "flash", "fused", "unfused")
ENV_BY_BACKEND = {
    "flash": "NVTE_FLASH_ATTN",
    "fused": "NVTE_FUSED_ATTN",
    "unfused": "NVTE_UNFUSED_ATTN",
}
FA2_MIN = (2, 1, 1)  # utils.py:116
FA2_MIN_BLACKWELL = (2, 7, 3)  # utils.py:117, applied on sm100+ (backends.py:96-97)
FA2_MAX = {(2, 9): (2, 8, 1), (2, 10): (2, 8, 3), (2, 11): (2, 8, 3)}  # utils.py:118 per tag
DTYPES = ("bf16", "fp16", "fp32")
SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")
CP_COMM_TYPES = ("p2p", "a2a", "all_gather", "a2a+p2p")


def _where(lines: str, te: tuple[int, int] = (2, 11), file: str = "utils.py") -> str:
    return f"{file}:{lines} at TE v{te[0]}.{te[1]}"


@dataclass(frozen=True)
class Container:
    """The software a run's TE selection depends on: TE's version (major, minor), the
    cuDNN library it loads, flash-attn 2's version if installed, whether the
    ``flash-attn-3`` package is installed. Two containers of the same software are equal."""

    name: str = field(compare=False)
    te: tuple[int, int]
    cudnn: tuple[int, int, int]
    flash_attn_2: tuple[int, int, int] | None = None
    flash_attn_3: bool = False
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.te not in TE_VERSIONS:
            raise InputError("container.te", self.te, f"must be one of {list(TE_VERSIONS)}")
        if len(self.cudnn) != 3 or not all(isinstance(v, int) for v in self.cudnn):
            raise InputError("container.cudnn", self.cudnn, "must be (major, minor, patch)")
        fa2 = self.flash_attn_2
        if fa2 is not None and (len(fa2) != 3 or not all(isinstance(v, int) for v in fa2)):
            raise InputError("container.flash_attn_2", fa2, "must be (major, minor, patch) or None")

    @property
    def cudnn_int(self) -> int:
        """cuDNN's version as ``cudnnGetVersion`` returns it (9.15.0 -> 91500)."""
        major, minor, patch = self.cudnn
        return major * 10000 + minor * 100 + patch


DEFAULT_CONTAINER = Container(
    "ngc-pytorch-25.11+te-2.11",
    te=(2, 11),
    cudnn=(9, 15, 0),
    flash_attn_2=(2, 7, 4),
    flash_attn_3=False,
    source=(
        "megatron-core 0.16.1's dev CI base image nvcr.io/nvidia/pytorch:25.11-py3 "
        "(docker/.ngc_version.dev and .gitlab/stages/01.build.yml:67 at core_v0.16.1); TE 2.11, "
        "the newest megatron-core 0.16 allows (its CI lock builds TE at the v2.12 tag, "
        "uv.lock:6712-6714, outside that range); flash-attn 2 installed (TE v2.11 README: "
        "'NGC PyTorch 23.08+ containers include FlashAttention-2'), version not read from "
        "the image, taken inside TE's gate on every architecture; no flash-attn-3 (a manual "
        "install, utils.py:136-141); cuDNN 9.15.0 not read from the image either: every "
        "cuDNN in CUDNN_VERSIONS gives the same pick for causal training without a window"
    ),
)
"""The container the pick is made under (see ``source`` for what is read and what is not)."""

CUDNN_VERSIONS = ((9, 10, 2), (9, 13, 0), (9, 14, 0), (9, 15, 0), (9, 17, 0))
"""9.10.2: the cuDNN wheel a pip install of megatron-core 0.16.1 resolves
(nvidia-cudnn-cu12 9.10.2.21, uv.lock:3450-3451 at core_v0.16.1); 9.13-9.17: the NGC
PyTorch releases of TE 2.9-2.11's time (25.09-26.01, versions not read here); 9.14.0 is
a version TE gates on by name (fused_attn.cpp:478-486)."""
FLASH_INSTALLS: tuple[tuple[tuple[int, int, int] | None, bool], ...] = (
    (None, False),
    ((2, 7, 4), False),
    ((2, 8, 3), False),
    ((2, 7, 4), True),
    (None, True),
)
"""(flash-attn 2, flash-attn-3): none; flash-attn 2 inside every TE gate (2.7.4); the
newest TE 2.10/2.11 accept (2.8.3, above TE 2.9's 2.8.1); either with flash-attn-3."""


def _containers() -> tuple[Container, ...]:
    out = []
    for te, cudnn, (fa2, fa3) in itertools.product(TE_VERSIONS, CUDNN_VERSIONS, FLASH_INSTALLS):
        parts = [] if fa2 is None else ["fa" + ".".join(map(str, fa2))]
        fa = "+".join([*parts, *(["fa3"] if fa3 else [])]) or "no-flash-attn"
        name = f"te-{te[0]}.{te[1]}+cudnn-{'.'.join(map(str, cudnn))}+{fa}"
        out.append(Container(name, te, cudnn, fa2, fa3))
    return tuple(out)


CONTAINERS: tuple[Container, ...] = _containers()
"""Every container the spread considers: TE 2.9-2.11 x ``CUDNN_VERSIONS`` x
``FLASH_INSTALLS`` (75). A flash-attn outside TE's gate is the same as none installed."""


@dataclass(frozen=True)
class AttentionQuery:
    """What TE's selection reads for one Megatron-core GPT training run's attention.

    ``num_attention_heads`` and ``num_query_groups`` are the model's; TE sees them per
    tensor-parallel rank (``num_heads``, ``num_gqa_groups``). ``max_seqlen_q`` /
    ``max_seqlen_kv`` are the whole sequence: under CP TE multiplies the local length by
    the CP size (dot_product_attention.py:1215-1233). ``attn_mask_type`` is what TE gets:
    Megatron's GPT layer gives ``causal`` and turns it into ``padding_causal`` for packed
    (``thd``) sequences (transformer_engine.py:1397-1402 in megatron-core 0.16.1).
    ``attention_backend`` is Megatron's ``--attention-backend`` (None: TE used directly,
    the environment read as given). ``deterministic_mode`` is Megatron's flag.
    """

    compute_capability: tuple[int, int]
    num_attention_heads: int
    num_query_groups: int
    head_dim_qk: int
    head_dim_v: int
    max_seqlen_q: int
    max_seqlen_kv: int
    tensor_parallel_size: int = 1
    dtype: str = "bf16"
    attn_mask_type: str = "causal"
    qkv_format: str = "sbhd"
    attention_dropout: float = 0.0
    context_parallel_size: int = 1
    cp_comm_type: str = "p2p"
    window_size: tuple[int, int] | None = None
    deterministic_mode: bool = False
    attention_backend: str | None = "auto"
    softmax_type: str = "vanilla"
    return_max_logit: bool = False
    """Megatron's ``--qk-clip`` / ``--log-max-attention-logit`` (transformer_engine.py:1308-1314)."""
    pad_between_seqs: bool = False
    """Packed sequences with padding between them (dot_product_attention.py:1298-1309)."""
    env: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        cc = self.compute_capability
        if len(cc) != 2 or not all(isinstance(v, int) and v >= 0 for v in cc):
            raise InputError("compute_capability", cc, "must be (major, minor)")
        for name in ("num_attention_heads", "num_query_groups", "head_dim_qk", "head_dim_v"):
            require_positive_int(name, getattr(self, name))
        for name in ("max_seqlen_q", "max_seqlen_kv", "tensor_parallel_size"):
            require_positive_int(name, getattr(self, name))
        require_positive_int("context_parallel_size", self.context_parallel_size)
        if self.num_attention_heads % self.num_query_groups:
            raise InputError(
                "num_query_groups",
                self.num_query_groups,
                f"must divide num_attention_heads {self.num_attention_heads}",
            )
        if self.num_query_groups % self.tensor_parallel_size:
            raise InputError(
                "tensor_parallel_size",
                self.tensor_parallel_size,
                f"must divide num_query_groups {self.num_query_groups}",
            )
        self._check_choice("dtype", self.dtype, DTYPES)
        self._check_choice("qkv_format", self.qkv_format, ("sbhd", "thd"))
        mask = "padding_causal" if self.qkv_format == "thd" else "causal"
        if self.attn_mask_type != mask:
            raise InputError(
                "attn_mask_type",
                self.attn_mask_type,
                f"Megatron's GPT training passes {mask} with qkv_format {self.qkv_format}",
            )
        if not 0.0 <= self.attention_dropout < 1.0:
            raise InputError("attention_dropout", self.attention_dropout, "must be in [0, 1)")
        self._check_choice("cp_comm_type", self.cp_comm_type, CP_COMM_TYPES)
        self._check_choice("softmax_type", self.softmax_type, SOFTMAX_TYPES)
        if self.attention_backend is not None:
            self._check_choice("attention_backend", self.attention_backend, MEGATRON_BACKENDS)
        if self.window_size is not None:
            left, right = self.window_size
            if left < -1 or right < -1 or (left == -1 and right not in (-1, 0)):
                raise InputError(
                    "window_size",
                    self.window_size,
                    "a causal mask takes (-1, -1), (-1, 0) or (>= 0, any) (utils.py:2045-2058)",
                )
        self.effective_env()  # Megatron's assertions on the environment
        self.deterministic  # noqa: B018  (an unreadable NVTE_ALLOW_NONDETERMINISTIC_ALGO)

    @staticmethod
    def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
        if value not in choices:
            raise InputError(name, value, f"must be one of {list(choices)}")

    @property
    def num_heads(self) -> int:
        """Query heads per TP rank, as TE sees them (``query_layer.shape[-2]``)."""
        return self.num_attention_heads // self.tensor_parallel_size

    @property
    def num_gqa_groups(self) -> int:
        return self.num_query_groups // self.tensor_parallel_size

    @property
    def window(self) -> tuple[int, int]:
        """The window TE selects with: ``check_set_window_size`` (utils.py:2031-2073),
        run before the selection (dot_product_attention.py:1081-1083), makes a causal
        mask's window (-1, 0) or (left, 0)."""
        if self.window_size is None or self.window_size == (-1, -1):
            return (-1, 0)
        left, right = self.window_size
        return (left, 0) if left >= 0 and right != 0 else (left, right)

    def effective_env(self) -> dict[str, str]:
        """The environment TE reads, after Megatron's ``_set_attention_backend``."""
        env = dict(self.env)
        if self.attention_backend is None:
            return env
        for backend, var in ENV_BY_BACKEND.items():
            want = "1" if self.attention_backend in ("auto", backend) else "0"
            if var in env and env[var] != want:
                raise InputError(
                    f"env.{var}",
                    env[var],
                    f"--attention-backend {self.attention_backend} sets it to {want}; Megatron "
                    "asserts it is unset or equal (language_module.py:102 in megatron-core 0.16.1)",
                )
            env[var] = want
        return env

    @property
    def deterministic(self) -> bool:
        """TE's ``deterministic``: ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0`` or
        ``torch.are_deterministic_algorithms_enabled()`` (dot_product_attention.py:395-398).
        Megatron's ``--deterministic-mode`` sets both at the recordings' snapshot
        (megatron/training/determinism.py:29, 155-158 and arguments.py:1708-1711); in
        megatron-core 0.16.1 it raises unless the variable is 0 (transformer_engine.py:1254-1260)."""
        var = "env.NVTE_ALLOW_NONDETERMINISTIC_ALGO"
        raw = self.env.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO")
        try:
            allowed = 1 if raw is None else int(raw)
        except ValueError:
            raise InputError(var, raw, "TE reads it with int()") from None
        if self.deterministic_mode and raw is not None and allowed != 0:
            raise InputError(
                var, raw, "--deterministic-mode asserts it unset or 0 (determinism.py:61)"
            )
        return self.deterministic_mode or allowed == 0


@dataclass(frozen=True)
class BackendSelection:
    """TE's pick for a query under ``container``.

    ``backend`` is None where no backend is left (TE raises at the first forward).
    ``reasons``: the first reason TE's code disables each backend for, naming its source
    line. ``spread``: every backend some container of the set picks; ``no_backend_in``: the
    containers where none is left; ``refused``: backends no container of the set runs."""

    backend: Backend | None
    flash_version: int | None
    available: tuple[Backend, ...]
    reasons: tuple[str, ...]
    spread: tuple[Backend, ...]
    no_backend_in: tuple[str, ...]
    refused: tuple[Backend, ...]
    container: Container


class _Rule:
    """One evaluation of TE's filters: which of flash 2, flash 3, fused, unfused is on."""

    def __init__(self, query: AttentionQuery, container: Container) -> None:
        self.q, self.c = query, container
        env = query.effective_env()
        self.on = {
            "flash2": self._flag(env, "NVTE_FLASH_ATTN"),
            "flash3": self._flag(env, "NVTE_FLASH_ATTN"),
            "fused": self._flag(env, "NVTE_FUSED_ATTN"),
            "unfused": self._flag(env, "NVTE_UNFUSED_ATTN"),
        }
        set_by = (
            f", set by --attention-backend {query.attention_backend} (language_module.py:92-126)"
            if query.attention_backend not in (None, "auto")
            else ""
        )
        self.why: dict[str, str] = {
            k: f"{k}: NVTE_{'FLASH' if k.startswith('flash') else k.upper()}_ATTN=0 "
            f"({_where('407-412')}{set_by})"
            for k, v in self.on.items()
            if not v
        }

    @staticmethod
    def _flag(env: Mapping[str, str], var: str) -> bool:
        raw = env.get(var, "1")
        try:
            return int(raw) != 0
        except ValueError:
            raise InputError(
                f"env.{var}", raw, "TE reads it with int() (utils.py:407-412)"
            ) from None

    def off(self, backends: str, reason: str, where: str) -> None:
        for name in backends.split():
            if self.on[name]:
                self.on[name] = False
                self.why[name] = f"{name}: {reason} ({where})"

    def run(self) -> None:
        q, c, te = self.q, self.c, self.c.te
        cc = q.compute_capability
        sq, skv, dqk, dv = q.max_seqlen_q, q.max_seqlen_kv, q.head_dim_qk, q.head_dim_v
        thd, cp = q.qkv_format == "thd", q.context_parallel_size > 1
        if cc < (8, 0):
            self.off("flash2 fused", "compute capability below sm80", _where("422-429"))
        if cc != (9, 0):
            self.off("flash3", "compute capability is not sm90", _where("430-433"))
        if q.dtype not in ("bf16", "fp16"):
            self.off("flash2 flash3 fused", f"qkv dtype {q.dtype}", _where("435-465"))
        if q.return_max_logit:
            self.off("flash2 flash3", "max_logit is returned", _where("530-534"))
            if thd and te < (2, 11):
                lines = {(2, 9): "515-517", (2, 10): "535-537"}[te]
                self.off("fused", "max_logit with qkv_format thd", _where(lines, te))
        if dqk != dv:
            self.off("flash2", "head_dim_qk != head_dim_v (MLA)", _where("594-597"))
            if cc == (12, 0) and (dqk > 128 or dqk % 8):
                self.off("fused", "MLA backward on sm120 with this head_dim_qk", _where("606-618"))
        if dqk > 256 or dqk % 8 or (dqk > 192 and cc not in ((8, 0), (9, 0), (10, 0), (12, 0))):
            self.off(
                "flash2",
                f"head_dim_qk {dqk} (<= 256, % 8, > 192 on sm80/90/100/120 only)",
                _where("620-638"),
            )
        if not self._fa3_supported():
            self.off(
                "flash3",
                f"heads {q.num_heads}/{q.num_gqa_groups}, head dims {dqk}/{dv}",
                _where("639-673"),
            )
        if thd:
            if te < (2, 11):
                lines = {(2, 9): "659-662", (2, 10): "679-682"}[te]
                self.off("unfused", "qkv_format thd", _where(lines, te))
            if q.pad_between_seqs:
                self.off("flash2 flash3", "thd with padding between sequences", _where("676-685"))
            if cc == (12, 0):
                self.off("fused", "qkv_format thd on sm120", _where("686-692"))
        if q.attention_dropout != 0.0:
            self.off("flash3", "attention dropout", _where("694-697"))
        if q.softmax_type != "vanilla":
            self.off("flash2 flash3", f"softmax_type {q.softmax_type}", _where("708-710"))
            if thd:
                self.off(
                    "fused unfused", f"softmax_type {q.softmax_type} with thd", _where("718-727")
                )
            if cp:
                self.off("unfused", f"softmax_type {q.softmax_type} under CP", _where("728-734"))
                if q.cp_comm_type != "a2a":
                    self.off(
                        "fused",
                        f"softmax_type {q.softmax_type} under CP {q.cp_comm_type}",
                        _where("735-742"),
                    )
        if cp:
            self.off("unfused", "context parallelism", _where("756-760"))
            if sq != skv:
                self.off("flash2 flash3", "CP with causal cross-attention", _where("774-779"))
                self.off("fused", "CP with causal cross-attention", _where("801-806"))
        if sq != skv:
            self.off("flash2 flash3", "causal mask with s_q != s_kv", _where("854-864"))
        left, right = q.window
        if left != -1 or right not in (-1, 0):
            if right != 0 or q.attention_dropout != 0.0:
                self.off(
                    "fused", "sliding window needs (left, 0) and no dropout", _where("876-888")
                )
            elif sq > skv:
                self.off("fused", "sliding window with s_q > s_kv", _where("889-894"))
            if c.flash_attn_2 is not None and c.flash_attn_2 < (2, 3, 0):
                self.off("flash2", "sliding window needs flash-attn 2.3+", _where("895-902"))
        if self.on["fused"] and (missing := self._cudnn_gap()):
            self.off("fused", f"no cuDNN sub-backend: {missing}", _where("970-1001"))
        if q.deterministic:
            if c.flash_attn_2 is not None and c.flash_attn_2 < (2, 4, 1):
                self.off("flash2", "deterministic needs flash-attn 2.4.1+", _where("1040-1049"))
            if cc < (9, 0) or c.cudnn < (8, 9, 5):
                self.off(
                    "fused",
                    "deterministic F16_arbitrary_seqlen below sm90 (or cuDNN < 8.9.5)",
                    _where("1055-1066"),
                )
            if cc >= (10, 0):
                self.off(
                    "fused", "deterministic training on Blackwell (sm100+)", _where("1067-1070")
                )
        if not self._fa2_installed():
            fa2 = c.flash_attn_2
            got = "not installed" if fa2 is None else f"{'.'.join(map(str, fa2))} outside TE's gate"
            self.off(
                "flash2",
                f"flash-attn 2 {got}",
                _where("91-100", te, "backends.py") + "; " + _where("1108-1109"),
            )
        if not c.flash_attn_3:
            self.off("flash3", "flash-attn-3 not installed", _where("1110-1111"))

    def _fa2_installed(self) -> bool:
        """backends.py:91-100: flash-attn 2 counts as installed only inside TE's gate."""
        if (fa2 := self.c.flash_attn_2) is None:
            return False
        low = FA2_MIN_BLACKWELL if self.q.compute_capability >= (10, 0) else FA2_MIN
        return low <= fa2 <= FA2_MAX[self.c.te]

    def _fa3_supported(self) -> bool:
        """``_is_fa3_supported`` (utils.py:641-652)."""
        q, dqk, dv = self.q, self.q.head_dim_qk, self.q.head_dim_v
        if dqk > 256 or q.num_heads % q.num_gqa_groups:
            return False
        if dqk != dv:
            mla = (128 < dqk <= 192 and 96 < dv <= 128) or (dqk <= 64 and dv <= 512)
            if not mla or (dv > 256 and q.dtype not in ("bf16", "fp16")):
                return False
        return True

    def _cudnn_gap(self) -> str | None:
        """The first clause of ``nvte_get_fused_attn_backend``'s F16_arbitrary_seqlen flag
        (fused_attn.cpp:290-445) the query fails, in training, without bias, non-paged;
        then the post checks of fused_attn.cpp:471-486 (the 9.14.0 one from v2.10)."""
        q, cud, te = self.q, self.c.cudnn_int, self.c.te
        sm = q.compute_capability[0] * 10 + q.compute_capability[1]
        sq, skv, dqk, dv = q.max_seqlen_q, q.max_seqlen_kv, q.head_dim_qk, q.head_dim_v
        h, g, thd = q.num_heads, q.num_gqa_groups, q.qkv_format == "thd"
        causal, dropout = q.attn_mask_type == "causal", q.attention_dropout != 0.0
        left, right = q.window
        arch = (
            (cud < 8903 and sm in (80, 90))
            or (cud >= 8903 and 80 <= sm < 100)
            or (cud >= 90700 and sm >= 80)
        )
        if not arch:
            return f"sm{sm} with cuDNN {cud} (fused_attn.cpp:293-295)"
        if cud < 90000 and (sq % 64 or skv % 64):
            return "sequence lengths % 64 before cuDNN 9.0 (fused_attn.cpp:297-298)"
        if cud < 8907 and h != g:
            return "GQA before cuDNN 8.9.7 (fused_attn.cpp:300-301)"
        dims = (
            dqk % 8 == 0
            and dv % 8 == 0
            and (
                (dqk <= 128 and dv <= 128)
                or (dqk <= 256 and dv <= 256 and sm == 90 and cud >= 90500)
                or (dqk == 192 and dv == 128 and sm >= 100 and cud >= 91100)
            )
        )
        hopper_mla = cud >= 91100 and sm == 90 and min(dqk, dv) >= 128 and dqk != dv
        mla_bug = hopper_mla and (dqk, dv) != (192, 128)
        if not dims or mla_bug:
            return f"head dims {dqk}/{dv} on sm{sm} with cuDNN {cud} (fused_attn.cpp:302-329)"
        mask_ok = (
            (causal and not thd)
            or (not causal and not thd and cud >= 8906)
            or (not causal and thd and cud >= 90100)
            or (not causal and cud >= 90700 and not dropout)
        )
        if not mask_ok:
            return f"{q.attn_mask_type} with cuDNN {cud} (fused_attn.cpp:343-387)"
        if thd and not (sm >= 90 and (cud >= 90600 or (cud >= 90100 and h == g))):
            return f"thd on sm{sm} with cuDNN {cud} (fused_attn.cpp:393-402)"
        full = left == -1 and right in (-1, 0)
        swa_92 = right == 0 and causal and sq <= skv and not dropout and not thd
        swa_96 = right == 0 and not causal and sq <= skv and not dropout
        window_ok = full or (cud >= 90200 and swa_92) or (cud >= 90600 and swa_96)
        if not window_ok:
            return f"window {q.window} with cuDNN {cud} (fused_attn.cpp:403-433)"
        if thd and cud < 90500 and max(h * dqk * sq, g * dqk * skv, g * dv * skv) > 2**31 - 1:
            return "64-bit ragged offsets before cuDNN 9.5 (fused_attn.cpp:221-228)"
        if cud in (91000, 91001):
            return "cuDNN 9.10.0/9.10.1 (fused_attn.cpp:436-437)"
        if q.softmax_type != "vanilla" and cud < 91301:
            return f"softmax_type {q.softmax_type} before cuDNN 9.13.1 (fused_attn.cpp:438-443)"
        if cud < 8900:
            return "cuDNN below 8.9.0 (fused_attn.cpp:471-477)"
        if te >= (2, 10) and cud == 91400 and skv > 1024 and left != -1 and not causal:
            return "cuDNN 9.14.0, non-causal window, s_kv > 1024 (fused_attn.cpp:478-486)"
        return None

    def pick(self) -> tuple[Backend | None, int | None, tuple[Backend, ...]]:
        """(backend, flash version, available): utils.py:1107-1146."""
        flash_version = 3 if self.on["flash3"] else 2 if self.on["flash2"] else None
        on = {
            "flash": flash_version is not None,
            "fused": self.on["fused"],
            "unfused": self.on["unfused"],
        }
        available = tuple(b for b in BACKENDS if on[b])
        chosen = list(available)
        if "flash" in chosen and "fused" in chosen and self.q.compute_capability >= (9, 0):
            chosen.remove("flash")
            self.why["flash-priority"] = (
                "flash: available, FusedAttention preferred on Hopper+ (utils.py:1133-1139)"
            )
        backend = chosen[0] if chosen else None
        return backend, flash_version if backend == "flash" else None, tuple(available)


def _evaluate(query: AttentionQuery, container: Container) -> _Rule:
    (rule := _Rule(query, container)).run()
    return rule


def select_attention_backend(
    query: AttentionQuery,
    container: Container = DEFAULT_CONTAINER,
    containers: tuple[Container, ...] = CONTAINERS,
) -> BackendSelection:
    """TE's pick for ``query`` under ``container``, with its spread over ``containers``."""
    rule = _evaluate(query, container)
    backend, flash_version, available = rule.pick()
    picked: set[Backend] = set()
    ever: set[Backend] = set()
    none_in = []
    for other in containers:
        theirs, _, avail = _evaluate(query, other).pick()
        ever.update(avail)
        if theirs is None:
            none_in.append(other.name)
        else:
            picked.add(theirs)
    reasons = [
        rule.why[k]
        for k in ("flash2", "flash3", "fused", "unfused", "flash-priority")
        if k in rule.why
    ]
    return BackendSelection(
        backend=backend,
        flash_version=flash_version,
        available=available,
        reasons=tuple(reasons),
        spread=tuple(b for b in BACKENDS if b in picked),
        no_backend_in=tuple(none_in),
        refused=tuple(b for b in BACKENDS if b not in ever),
        container=container,
    )
