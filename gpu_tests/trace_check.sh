#!/usr/bin/env bash
# Prepared memory-history check for one lent H200: fits in 8 minutes end to end.
#
# Why: three figures of the estimator are unexplained (gpu_tests/README.md, "The trace
# check"). Each cell below measures one cell as h200_check.sh does and also records one
# extra, unmeasured step with --memory-history; the analyser (python -m
# gpu_tests.driver.history) then names the tensors live at the forward peak.
#   q3-*     Qwen3-1.7B, 8 layers, 8,192 tokens, TP1: which query-wide tensor per
#            attention layer the rank simulator misses, and whether it is also kept
#            under core_attn+mlp and without recompute.
#   q35-4b-* Qwen3.5-4B, 8 layers, 16,384 tokens, TP1, core_attn+mlp: whether the
#            runtime copies the query across a rank's 4 KV groups, as the simulator does.
#   q35-27b-* Qwen3.5-27B, 8 layers, 64+64 and 256+256 tokens: the fixed 35-130 MiB.
#   q3-1.7b-tp2-nosp-* (optional, last, only with megatron and budget left): the same at
#            TP2 on the one GPU (two gloo processes, SP off: megatron's torch norm
#            refuses SP), the measured cells' TP.
# Cells run in that order; one that would start with under MIN_CELL_S of the budget
# left is skipped (and said so), so the table and archives are always written.
#
# Run from the repository root (on the device machine, with the revision known here):
#   CPMEM_SOURCE_COMMIT=<40-hex> bash gpu_tests/trace_check.sh
# Output under $OUT (or ./trace-out), at most four files: check.log (everything,
# with each cell's top groups), rows.csv (golden schema, one row per cell),
# analyses.tar.gz (per cell: summary.json, history.json, history.txt) and, only when
# it stays under PICKLE_MAX_MB, pickles.tar.gz (the raw snapshots).
#
# DRY_RUN=1 (no GPU needed): validates every cell's real arguments, then runs each
# cell on the CPU at 1 layer and 64 tokens per sequence (the driver measures nothing
# there and records no history) so that every step of this script is exercised.
set -euo pipefail

BUDGET_S="${BUDGET_S:-470}"
if [[ -z "${CPMEM_TRACE_INNER:-}" ]]; then
  export CPMEM_TRACE_INNER=1
  exec timeout --kill-after=15 "$BUDGET_S" bash "$0" "$@"
fi

OUT="${OUT:-./trace-out}"
mkdir -p "$OUT"
LOG="$OUT/check.log"
PY="${PYTHON:-python3}"
CELL_TIMEOUT="${CELL_TIMEOUT:-110}"
MIN_CELL_S="${MIN_CELL_S:-45}"
RESERVE_S="${RESERVE_S:-30}"
DRY_RUN="${DRY_RUN:-0}"
PICKLE_MAX_MB="${PICKLE_MAX_MB:-15}"
TOP="${TOP:-12}"
export PYTHONUNBUFFERED=1
exec > >(tee -a "$LOG") 2>&1

echo "== trace_check $(date -u +%Y-%m-%dT%H:%M:%SZ) budget ${BUDGET_S}s dry_run=$DRY_RUN"
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

# Qwen3-1.7B: megatron-core's attention is what the measured cells ran; without it the
# torch engine stands in (a different attention: say so in every reading).
Q3_ENGINE=megatron
if [[ "$HAVE_MEGATRON" != 1 ]]; then
  Q3_ENGINE=torch
  echo "megatron-core missing: the Qwen3-1.7B cells run on the torch engine instead"
fi

CELLS_DIR="$(mktemp -d /tmp/trace-cells.XXXX)"
FAILED=0

dry_args() {  # the cell's arguments at 1 layer and 64 tokens per sequence
  local prev=""
  for a in "$@"; do
    case "$prev" in
      --layers) printf '%s\n' 1 ;;
      --lengths) printf '%s\n' "$(sed -E 's/[0-9]+/64/g' <<<"$a")" ;;
      *) printf '%s\n' "$a" ;;
    esac
    prev="$a"
  done
}

run_cell() {  # name, then driver arguments
  local name="$1"; shift
  local args=("$@")
  # keep RESERVE_S for the table and the archives; a cell needs at least MIN_CELL_S
  local left=$(( BUDGET_S - SECONDS - RESERVE_S ))
  if (( left < MIN_CELL_S )); then
    echo "== cell $name SKIPPED: ${left}s of the budget left (needs ${MIN_CELL_S}s)"
    return
  fi
  local limit=$(( left < CELL_TIMEOUT ? left : CELL_TIMEOUT ))
  echo "== cell $name (limit ${limit}s): ${args[*]}"
  if [[ "$DRY_RUN" == 1 ]]; then
    "$PY" -c 'import sys
from gpu_tests.driver import build_parser, spec_from_args
print("valid:", spec_from_args(build_parser().parse_args(sys.argv[1:])))' "${args[@]}" \
      || { echo "cell $name: INVALID arguments"; FAILED=1; return; }
    mapfile -t args < <(dry_args "${args[@]}")
    echo "   dry run as: ${args[*]}"
  fi
  local dir="$CELLS_DIR/$name"
  if timeout --kill-after=10 "$limit" "$PY" -m gpu_tests.driver "${args[@]}" \
      --device "$DEVICE" --timeout "$limit" --out "$dir" --memory-history history.pickle; then
    :
  else
    echo "cell $name FAILED (exit $?)"
    FAILED=1
  fi
  if [[ -f "$dir/history.pickle" ]]; then
    "$PY" -m gpu_tests.driver.history "$dir/history.pickle" --top "$TOP" --depth 2 \
      --json-out "$dir/history.json" >"$dir/history.txt" || echo "cell $name: history analysis failed"
    echo "-- $name: tensors live (grouped by the two innermost frames in the repo/megatron/torch.nn)"
    cat "$dir/history.txt" || true
    ls -l "$dir/history.pickle"
  else
    echo "-- $name: no memory history (CPU run or the cell failed)"
  fi
}

L17=(--model qwen3-1.7b --layers 8 --lengths 8192 --engine "$Q3_ENGINE")
run_cell q3-1.7b-core_attn "${L17[@]}" --recompute selective --modules core_attn
run_cell q3-1.7b-core_attn+mlp "${L17[@]}" --recompute selective --modules core_attn+mlp
run_cell q3-1.7b-none "${L17[@]}" --recompute none
run_cell q35-4b-16k-core_attn+mlp --model qwen3.5-4b --layers 8 --lengths 16384 \
  --recompute selective --modules core_attn+mlp --engine torch
run_cell q35-27b-64+64 --model qwen3.5-27b --layers 8 --lengths 64+64 \
  --recompute selective --modules core_attn
run_cell q35-27b-256+256 --model qwen3.5-27b --layers 8 --lengths 256+256 \
  --recompute selective --modules core_attn
# Optional, last: the measured cells' TP2 on this one GPU (two gloo processes; megatron's
# torch norm refuses SP, hence --no-sp). Runs only if the budget still allows it.
if [[ "$Q3_ENGINE" == megatron ]]; then
  run_cell q3-1.7b-tp2-nosp-core_attn "${L17[@]}" --tp 2 --no-sp \
    --recompute selective --modules core_attn
fi

"$PY" -c 'import sys
from pathlib import Path
from gpu_tests.driver.rows import merge_cell_rows
print(f"wrote {sys.argv[2]} ({merge_cell_rows(Path(sys.argv[1]), Path(sys.argv[2]))} rows)")' \
  "$CELLS_DIR" "$OUT/rows.csv"
"$PY" - "$CELLS_DIR" <<'PY'
import json, sys
from pathlib import Path
cells = Path(sys.argv[1])
mib = 2**20
# fwd: the driver's measured forward peak; hist-fwd: the history's forward peak (the
# extra step, same quantity); end: live at the forward's end; top: its largest group
# req: the bytes the callers asked for at the forward peak (the allocator's
# requested_bytes; fwd - req is its rounding of requests up to blocks)
print(f"{'cell':26s} {'fwd MiB':>9s} {'req MiB':>9s} {'f+b MiB':>9s} {'est MiB':>9s} {'hist-fwd':>9s} {'end MiB':>9s}  top group at the forward peak")
for d in sorted(p for p in cells.iterdir() if p.is_dir()):
    s = json.loads((d / "summary.json").read_text()) if (d / "summary.json").exists() else None
    h = json.loads((d / "history.json").read_text()) if (d / "history.json").exists() else None
    def fmt(v):
        return f"{v / mib:9.1f}" if v is not None else "        -"
    a = s["aggregate"] if s else {}
    est = s["estimate"]["estimate_bytes"] if s else None
    fp = h["forward_peak"] if h else None
    fe = h["forward_end"] if h else None
    top = fp["groups"][0] if fp and fp["groups"] else None
    reqs = [x.get("forward_peak_requested_bytes") for r in (s["ranks"] if s else []) for x in r["samples"]]
    req = max((x for x in reqs if x is not None), default=None)
    what = f"{top['bytes'] / mib:.1f} MiB x{top['count']} {top['key']}" if top else "-"
    print(f"{d.name[:26]:26s} {fmt(a.get('forward_peak_bytes'))} {fmt(req)} {fmt(a.get('forward_backward_peak_bytes'))}"
          f" {fmt(est)} {fmt(fp['live_bytes'] if fp else None)} {fmt(fe['live_bytes'] if fe else None)}  {what}")
    for n in (s["notes"] if s else []):
        print(f"    note: {n}")
PY

# what comes back: at most 8 files of at most 16 MiB each
(cd "$CELLS_DIR" && find . \( -name summary.json -o -name 'history.json' -o -name 'history.txt' \) -print0 \
  | tar -czf - --null -T -) >"$OUT/analyses.tar.gz"
if compgen -G "$CELLS_DIR/*/history.pickle" >/dev/null; then
  (cd "$CELLS_DIR" && tar -czf /tmp/trace-pickles.tar.gz ./*/history.pickle)
  size_mb=$(( $(stat -c %s /tmp/trace-pickles.tar.gz) / 1048576 ))
  if (( size_mb < PICKLE_MAX_MB )); then
    mv /tmp/trace-pickles.tar.gz "$OUT/pickles.tar.gz"
  else
    echo "pickles: ${size_mb} MiB compressed, over ${PICKLE_MAX_MB} MiB: left out (analyses kept)"
    rm -f /tmp/trace-pickles.tar.gz
  fi
fi
ls -l "$OUT"
echo "== done; failed=$FAILED"
exit "$FAILED"
