#!/bin/bash
# the fifth configuration's TEST run (runs/ucr13/DECISION.md: adopted), one seed ($1, default 0)
# on two processes of one thread, the datasets balanced by round 7's seed-0 fit times (the
# fourth configuration's); MiniRocket's rows reused from round 7's seed 1 (its random_state is
# 0 in every run). Resumable: a rerun skips the datasets already in each part. ABLATION=1
# fits only the no-mixer ablations the parts' rows lack (ucr.py without --no-ablation), in
# the same files and probability folder. Join with
#   ucr.py --merge runs/ucr13/test/seed$1_a.json runs/ucr13/test/seed$1_b.json \
#       --results runs/ucr13/test/seed$1.json --plots /tmp/plots13
cd "$(dirname "$0")/../.." || exit 1
seed=${1:-0}
read -r first second < <(.venv/bin/python - <<'PY'
import json
from pathlib import Path
s0 = json.loads(Path("runs/ucr7/seed0.json").read_text())["datasets"]
cost = {n: r["linattn"]["fit_s"] + r["linattn"]["predict_s"] for n, r in s0.items()}
halves, sums = ([], []), [0.0, 0.0]
for n in sorted(cost, key=lambda n: -cost[n]):
    i = int(sums[0] > sums[1])
    halves[i].append(n)
    sums[i] += cost[n]
print(",".join(halves[0]), ",".join(halves[1]))
PY
)
what=${ABLATION:+ablation }
flag=--no-ablation
[ -n "${ABLATION:-}" ] && flag=
echo "seed $seed ${what}start $(date -u): [$first] [$second]" >> runs/ucr13/test/done.log
run() {  # $1 datasets, $2 part
  nice -n "${NICE:-5}" .venv/bin/python benchmarks/ucr.py --method conv --threads 1 --seed "$seed" \
    $flag --datasets "$1" --results "runs/ucr13/test/seed${seed}_$2.json" \
    --keep-proba "runs/ucr13/test/proba$seed" --reuse-minirocket runs/ucr7/seed1.json \
    --plots "/tmp/plots13_$2" >> "runs/ucr13/test/seed${seed}_$2.log" 2>&1
}
run "$first" a &
run "$second" b &
wait
echo "seed $seed ${what}done $(date -u)" >> runs/ucr13/test/done.log
