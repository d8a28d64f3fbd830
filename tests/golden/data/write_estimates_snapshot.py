"""Write every golden cell's and control's estimate under every policy (pre-layout-move)."""
import csv, json, sys
from cpmem.gate import cell_inputs
from cpmem.golden import load_cells
from cpmem.controls import control_grid
from cpmem.pricing import price, policy_names

out = csv.writer(open(sys.argv[1], "w", newline=""), lineterminator="\n")
out.writerow(["kind", "id", "policy", "estimate_bytes", "forward_backward_bytes", "busiest_rank", "busiest_tokens", "per_rank_bytes", "components"])
policies = policy_names()
for cell in load_cells():
    inputs = cell_inputs(cell)
    for p in policies:
        e = price(inputs, p)
        out.writerow(["cell", cell.cell_id, p, e.estimate_bytes, e.forward_backward_bytes or "", e.busiest_rank, e.busiest_tokens, "+".join(map(str, e.per_rank_bytes)), json.dumps(e.components, sort_keys=True, separators=(",", ":"))])
for req in control_grid():
    for p in policies:
        e = req.price(p)
        out.writerow(["control", req.control_id, p, e.estimate_bytes, e.forward_backward_bytes or "", e.busiest_rank, e.busiest_tokens, "+".join(map(str, e.per_rank_bytes)), json.dumps(e.components, sort_keys=True, separators=(",", ":"))])
