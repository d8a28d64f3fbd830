# Sourced by the prepared device scripts (h200_check.sh, trace_check.sh): the one
# environment both need on a bare device machine. Expects PY (the python to use).
#
# install_carried_wheels: the device has no internet; wheels carried in .whl/ go to
#   /tmp/site, put first on PYTHONPATH. cpmem is pure Python: the checkout itself goes
#   on PYTHONPATH instead of an install.
# require_cuda: print torch, CUDA and the device; fail where no CUDA device is visible.
# detect_packages: HAVE_MEGATRON, HAVE_FLA (0/1), printed; a warning without a source
#   commit (rows without one are refused by the golden schema).

install_carried_wheels() {
  if compgen -G ".whl/*.whl" >/dev/null; then
    echo "installing carried wheels from .whl/"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
}

require_cuda() {
  "$PY" - <<'PY'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda)
assert torch.cuda.is_available(), "no CUDA device visible"
print("device", torch.cuda.get_device_name(0))
PY
}

detect_packages() {
  HAVE_MEGATRON=0
  "$PY" -c "import megatron.core" 2>/dev/null && HAVE_MEGATRON=1
  HAVE_FLA=0
  "$PY" -c "from fla.ops.gated_delta_rule import chunk_gated_delta_rule" 2>/dev/null && HAVE_FLA=1
  echo "megatron-core: $HAVE_MEGATRON  flash-linear-attention: $HAVE_FLA"
  [[ -n "${CPMEM_SOURCE_COMMIT:-}" ]] \
    || echo "warning: CPMEM_SOURCE_COMMIT unset and no .git: rows get no source_commit"
}
