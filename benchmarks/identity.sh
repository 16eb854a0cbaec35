#!/usr/bin/env bash
# Fingerprints of the simulator's decisions, to check that a change of speed changed no
# decision: for every scenario of tests/scenarios and ../shared/scenarios, the Kueue
# baseline, kueue_large at scale 0.1, two 20,000-request months (one with
# --preempt-interactive) and the 100,000-request month, the sha256 of
# `simulate --events` and of the `--json` result without its wall time.
#
#     benchmarks/identity.sh [OUT] > before.txt   # ... change, `make core` ...
#     benchmarks/identity.sh [OUT] | diff before.txt -
#
# OUT (default benchmarks/generated/identity) holds the generated traces. ~1 minute.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$REPO/benchmarks/generated/identity}
PY=$REPO/.venv/bin/python
SIM=$REPO/.venv/bin/jupyter-gpuaas
mkdir -p "$OUT"/month "$OUT"/month20 "$OUT"/interactive "$OUT"/kueue
(cd "$REPO/benchmarks" && "$PY" - "$OUT" <<'PYEOF'
import sys
from pathlib import Path
import kueue_baseline, kueue_large, month_trace
out = Path(sys.argv[1])
month_trace.generate(out / "month")
month_trace.generate(out / "month20", requests=20000)
month_trace.generate(out / "interactive", requests=20000, preempt_interactive=True)
kueue_baseline.generate(out / "kueue")
kueue_large.generate(out / "kueue", scale=0.1)
PYEOF
)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
strip() {
  "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); d.pop('wall_seconds',None); print(json.dumps(d,sort_keys=True))" "$1" | sha256sum | cut -c1-16
}
one() {  # name, scenario path
  (cd "$(dirname "$2")" && "$SIM" simulate "$(basename "$2")" --json --events "$W/e" > "$W/j")
  echo "$1 $(sha256sum < "$W/e" | cut -c1-16) $(strip "$W/j")"
}
for f in "$REPO"/tests/scenarios/*.yaml "$REPO"/../shared/scenarios/*.yaml; do
  [ -f "$f" ] && one "$(basename "$f")" "$f"
done
one month "$OUT/month/month.json"
one month20 "$OUT/month20/month.json"
one interactive "$OUT/interactive/month.json"
one kueue-baseline "$OUT/kueue/kueue-baseline.json"
one kueue-large-0.1 "$OUT/kueue/kueue-large.json"
