#!/usr/bin/env bash
# Prepared trainer-step check for one lent H200: fits in 8 minutes end to end.
#
# Why: cpmem now prices a trainer's step beyond the calibration harness (an LM head and
# its loss, LoRA rank and dropout: cpmem/step/trainer.py, cpmem/pricing/head.py,
# cpmem/pricing/adapters.py), a first cut from the sources that no measurement has held
# yet. Each cell below measures one step with the driver (forward and forward+backward
# peaks, two repetitions) and prices the same step with cpmem (reference and tight); the
# table puts them side by side, and each term's increment over its model's harness cell
# measured next to priced:
#   <model>-base         the harness (hidden states out, rank-1 LoRA, no dropout)
#   <model>-lora16       --lora-rank 16 --lora-dropout 0.05 (PEFT's order: dropout before A)
#   <model>-logits       --head logits: final norm, frozen [H -> V] linear, megatron's
#                        vocab_parallel_cross_entropy (torch's over an fp32 upcast without
#                        megatron; the row's trainer_step says ce=torch, and that is not
#                        what cpmem prices)
#   <model>-chunked4096  --head chunked:4096: log-probs 4,096 tokens at a time, each chunk
#                        recomputed in backward (torch.utils.checkpoint)
# on q35-4b (Qwen3.5-4B, 8 layers, 8,192 tokens, TP1, torch engine: hybrid) and q3-1.7b
# (Qwen3-1.7B, 8 layers, 8,192 tokens, TP1, megatron engine; torch if megatron-core is
# missing, and the log says so), selective core_attn recompute. 8,192 tokens keep the
# logits under 2^31 elements (8,192 x 248,320 on Qwen3.5-4B).
# Cells run in that order; one that would start with under MIN_CELL_S of the budget
# left is skipped (and said so), so the table and rows are always written.
#
# Run from the repository root (on the device machine, with the revision known here):
#   CPMEM_SOURCE_COMMIT=<40-hex> bash gpu_tests/trainer_check.sh
# Output under $OUT (or ./trainer-out), four files: check.log (everything), table.txt
# (measured vs priced), rows.csv (golden columns plus the sidecar trainer_step column,
# which golden/'s importer refuses: these are not harness rows) and summaries.tar.gz
# (each cell's summary.json).
#
# DRY_RUN=1 (no GPU needed): validates every cell's real arguments, then runs each cell
# on the CPU at 1 layer and 64 tokens (chunked:16, so that several chunks run) through
# the whole script; the driver measures nothing there, the table shows cpmem's prices.
set -euo pipefail

DRY_RUN="${DRY_RUN:-0}"
if [[ "$DRY_RUN" == 1 ]]; then  # the CPU is slower than the GPU at the full vocabularies
  BUDGET_S="${BUDGET_S:-1500}"; CELL_TIMEOUT="${CELL_TIMEOUT:-400}"
else
  BUDGET_S="${BUDGET_S:-470}"; CELL_TIMEOUT="${CELL_TIMEOUT:-100}"
fi
if [[ -z "${CPMEM_TRAINER_INNER:-}" ]]; then
  export CPMEM_TRAINER_INNER=1 BUDGET_S CELL_TIMEOUT
  exec timeout --kill-after=15 "$BUDGET_S" bash "$0" "$@"
fi

OUT="${OUT:-./trainer-out}"
mkdir -p "$OUT"
LOG="$OUT/check.log"
PY="${PYTHON:-python3}"
MIN_CELL_S="${MIN_CELL_S:-40}"
RESERVE_S="${RESERVE_S:-25}"
export PYTHONUNBUFFERED=1
exec > >(tee -a "$LOG") 2>&1

echo "== trainer_check $(date -u +%Y-%m-%dT%H:%M:%SZ) budget ${BUDGET_S}s dry_run=$DRY_RUN"
source "$(dirname "$0")/device_env.sh"
if [[ "$DRY_RUN" == 1 ]]; then
  DEVICE=cpu
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  DEVICE=cuda
  install_carried_wheels
  require_cuda
fi
detect_packages
if [[ "$HAVE_MEGATRON" != 1 ]]; then
  echo "megatron-core missing: the logits cells use torch's cross entropy (ce=torch, not"
  echo "  what cpmem prices) and the Qwen3-1.7B cells run on the torch engine"
fi
Q3_ENGINE=megatron
[[ "$HAVE_MEGATRON" == 1 ]] || Q3_ENGINE=torch

CELLS_DIR="$(mktemp -d /tmp/trainer-cells.XXXX)"
FAILED=0

dry_args() {  # the cell's arguments at 1 layer, 64 tokens per sequence, chunks of 16
  local prev=""
  for a in "$@"; do
    case "$prev" in
      --layers) printf '%s\n' 1 ;;
      --lengths) printf '%s\n' "$(sed -E 's/[0-9]+/64/g' <<<"$a")" ;;
      --head) printf '%s\n' "$(sed -E 's/^chunked:[0-9]+$/chunked:16/' <<<"$a")" ;;
      *) printf '%s\n' "$a" ;;
    esac
    prev="$a"
  done
}

run_cell() {  # name, then driver arguments
  local name="$1"; shift
  local args=("$@")
  # keep RESERVE_S for the table and the archive; a cell needs at least MIN_CELL_S
  local left=$(( BUDGET_S - SECONDS - RESERVE_S ))
  if (( left < MIN_CELL_S )); then
    echo "== cell $name SKIPPED: ${left}s of the budget left (needs ${MIN_CELL_S}s)"
    return
  fi
  local limit=$(( left < CELL_TIMEOUT ? left : CELL_TIMEOUT ))
  echo "== cell $name (limit ${limit}s, at ${SECONDS}s): ${args[*]}"
  if [[ "$DRY_RUN" == 1 ]]; then
    "$PY" -c 'import sys
from gpu_tests.driver import build_parser, spec_from_args
print("valid:", spec_from_args(build_parser().parse_args(sys.argv[1:])))' "${args[@]}" \
      || { echo "cell $name: INVALID arguments"; FAILED=1; return; }
    mapfile -t args < <(dry_args "${args[@]}")
    echo "   dry run as: ${args[*]}"
  fi
  local start=$SECONDS
  if timeout --kill-after=10 "$limit" "$PY" -m gpu_tests.driver "${args[@]}" \
      --device "$DEVICE" --timeout "$limit" --out "$CELLS_DIR/$name"; then
    echo "-- $name done in $(( SECONDS - start ))s"
  else
    echo "cell $name FAILED (exit $?) after $(( SECONDS - start ))s"
    FAILED=1
  fi
}

L35=(--model qwen3.5-4b --layers 8 --lengths 8192 --engine torch)
L17=(--model qwen3-1.7b --layers 8 --lengths 8192 --engine "$Q3_ENGINE")
LORA=(--lora-rank 16 --lora-dropout 0.05)
run_cell q35-4b-base "${L35[@]}"
run_cell q35-4b-lora16 "${L35[@]}" "${LORA[@]}"
run_cell q35-4b-logits "${L35[@]}" --head logits
run_cell q35-4b-chunked4096 "${L35[@]}" --head chunked:4096
run_cell q3-1.7b-base "${L17[@]}"
run_cell q3-1.7b-lora16 "${L17[@]}" "${LORA[@]}"
run_cell q3-1.7b-logits "${L17[@]}" --head logits
run_cell q3-1.7b-chunked4096 "${L17[@]}" --head chunked:4096

"$PY" -c 'import sys
from pathlib import Path
from gpu_tests.driver.rows import merge_cell_rows
n = merge_cell_rows(Path(sys.argv[1]), Path(sys.argv[2]), trainer=True)
print(f"wrote {sys.argv[2]} ({n} rows, with the trainer_step sidecar column)")' \
  "$CELLS_DIR" "$OUT/rows.csv"
"$PY" -m gpu_tests.driver.trainer_table "$CELLS_DIR" | tee "$OUT/table.txt"
"$PY" - "$CELLS_DIR" <<'PY'
import json, sys
from pathlib import Path
notes = {}  # each note once, with the cells it was made for
for f in sorted(Path(sys.argv[1]).glob("*/summary.json")):
    for n in json.loads(f.read_text())["notes"]:
        notes.setdefault(n, []).append(f.parent.name)
for n, cells in notes.items():
    print(f"note ({', '.join(cells)}): {n}")
PY
(cd "$CELLS_DIR" && find . -name summary.json -print0 | tar -czf - --null -T -) \
  >"$OUT/summaries.tar.gz"
ls -l "$OUT"
echo "== done at ${SECONDS}s; failed=$FAILED"
exit "$FAILED"
