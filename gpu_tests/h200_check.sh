#!/usr/bin/env bash
# Prepared native check for one lent H200: fits in 8 minutes end to end.
#
# Why: a lent GPU comes for a few minutes, so every cell, its timeout and where its
# output goes are fixed here, tested on CPU beforehand, and run in one call.
#
# Run from the repository root (on the device machine, with the revision known here):
#   CPMEM_SOURCE_COMMIT=<40-hex> bash gpu_tests/h200_check.sh
# Output lands under $OUT (or ./native-out): rows.csv (golden schema, one row per
# cell), one <cell>.json summary per cell, and check.log.
#
# Dependencies: the device image has python3 with a CUDA torch, no megatron-core and
# no flash-linear-attention, and no internet. Carry wheels in .whl/ (see
# gpu_tests/README.md) to get them; without megatron the megatron cell is skipped and
# the log says so; without fla the GDN layers use the driver's pure-torch fallback and
# each summary reports its extra saved bytes (gdn_fallback_saved_bytes: saved beyond
# what fla's kernel saves) and the forward peak less them (column fwd-x).
set -euo pipefail

BUDGET_S="${BUDGET_S:-470}"
if [[ -z "${CPMEM_H200_INNER:-}" ]]; then
  export CPMEM_H200_INNER=1
  exec timeout --kill-after=15 "$BUDGET_S" bash "$0" "$@"
fi

OUT="${OUT:-./native-out}"
mkdir -p "$OUT"
LOG="$OUT/check.log"
PY="${PYTHON:-python3}"
CELL_TIMEOUT="${CELL_TIMEOUT:-140}"
export PYTHONUNBUFFERED=1
exec > >(tee -a "$LOG") 2>&1

echo "== h200_check $(date -u +%Y-%m-%dT%H:%M:%SZ) budget ${BUDGET_S}s"
source "$(dirname "$0")/device_env.sh"
install_carried_wheels
require_cuda
detect_packages

CELLS_DIR="$(mktemp -d /tmp/native-cells.XXXX)"
FAILED=0
run_cell() {  # name, then driver arguments
  local name="$1"; shift
  echo "== cell $name: $*"
  if "$PY" -m gpu_tests.driver "$@" --device cuda --timeout "$CELL_TIMEOUT" \
      --out "$CELLS_DIR/$name"; then
    cp "$CELLS_DIR/$name/summary.json" "$OUT/$name.json"
  else
    echo "cell $name FAILED (exit $?)"
    FAILED=1
    [[ -f "$CELLS_DIR/$name/summary.json" ]] && cp "$CELLS_DIR/$name/summary.json" "$OUT/$name.json"
  fi
}

REQ=(--lengths 2048+2048 --shared-prefix 512)
run_cell q35-4b-L8-cp1 --model qwen3.5-4b --layers 8 "${REQ[@]}" --cp 1
run_cell q35-4b-L8-cp2 --model qwen3.5-4b --layers 8 "${REQ[@]}" --cp 2
if [[ "$HAVE_MEGATRON" == 1 ]]; then
  run_cell q3-1.7b-L8-megatron --model qwen3-1.7b --layers 8 --lengths 4096 --engine megatron
else
  echo "skipping the megatron cell: megatron-core is not installed (carry its wheel in .whl/)"
fi
run_cell q3-1.7b-L8-torch --model qwen3-1.7b --layers 8 --lengths 4096 --engine torch

"$PY" -c 'import sys
from pathlib import Path
from gpu_tests.driver.rows import merge_cell_rows
print(f"wrote {sys.argv[2]} ({merge_cell_rows(Path(sys.argv[1]), Path(sys.argv[2]))} rows)")' \
  "$CELLS_DIR" "$OUT/rows.csv"
"$PY" - "$CELLS_DIR" <<'PY'
import json, sys
from pathlib import Path
cells = Path(sys.argv[1])
gib = 2**30
# fwd-x: forward peak less the GDN fallback's extra saved bytes (= fwd without fallback)
print(f"{'cell':70s} {'fwd GiB':>8s} {'fwd-x GiB':>9s} {'f+b GiB':>8s} {'est GiB':>8s} {'peak/est':>8s} finite")
for f in sorted(cells.glob("*/summary.json")):
    s = json.loads(f.read_text())
    a, e = s["aggregate"], s["estimate"]["estimate_bytes"]
    p, fb = a["forward_peak_bytes"], a["forward_backward_peak_bytes"]
    ratio = f"{p / e:8.3f}" if p is not None else "       -"
    fwd = f"{p / gib:8.3f}" if p is not None else "       -"
    fbs = f"{fb / gib:8.3f}" if fb is not None else "       -"
    px = a.get("forward_peak_less_gdn_fallback_bytes")
    fwx = f"{px / gib:9.3f}" if px is not None else "        -"
    print(f"{s['row']['cell_id'][:70]:70s} {fwd} {fwx} {fbs} {e / gib:8.3f} {ratio} {a['finite']}")
    for n in s["notes"]:
        print(f"    note: {n}")
PY
echo "== done; failed=$FAILED"
exit "$FAILED"
