#!/bin/bash
# once seeds 0 (lanes.sh) and 1 (lanes_b.sh) are done, split what is left of seed 2 over both cores: stop
# lanes_b.sh's seed-2 run (the dataset in progress is refitted), resume seed2.json on the
# first half of the remaining datasets and write the second half to seed2_part2.json; join the
# two afterwards. As run (twice: the first split, by count, was stopped after 2 minutes and this
# one, by time, rerun; done.log has both): the 41-dataset file was then renamed
# seed2_part1.json and the join is
#   ucr.py --merge runs/ucr7/seed2_part1.json runs/ucr7/seed2_part2.json \
#       --results runs/ucr7/seed2.json --plots /tmp/plots7_2
cd "$(dirname "$0")/../.." || exit 1
until grep -q "seed 0 done" runs/ucr7/done.log 2>/dev/null; do sleep 30; done
until grep -q "seed 1 done" runs/ucr7/done.log 2>/dev/null; do sleep 30; done
pkill -f "bash runs/ucr7/lanes_b.sh"
pkill -f "ucr.py --method conv --threads 1 --seed 2 "
sleep 5
read -r first second < <(.venv/bin/python - <<'PY'
import json
from pathlib import Path
from linattn.datasets import package_datasets
done = set()
p = Path("runs/ucr7/seed2.json")
if p.exists():
    done = set(json.loads(p.read_text())["datasets"])
left = [n for n in package_datasets() if n != "FordB" and n not in done]
# balanced by seed 1's fit + predict times (a split by count put 33 min on one core, 16 on the other)
s1 = json.loads(Path("runs/ucr7/seed1.json").read_text())["datasets"]
cost = {n: s1[n]["linattn"]["fit_s"] + s1[n]["linattn"]["predict_s"] for n in left}
halves, sums = ([], []), [0.0, 0.0]
for n in sorted(left, key=lambda n: -cost[n]):
    i = int(sums[0] > sums[1])
    halves[i].append(n)
    sums[i] += cost[n]
print(",".join(halves[0]), ",".join(halves[1]))
PY
)
echo "split $(date -u): [$first] [$second]" >> runs/ucr7/done.log
run() {  # $1 datasets, $2 results file, $3 plots folder
  nice -n 5 .venv/bin/python benchmarks/ucr.py --method conv --threads 1 --seed 2 --no-ablation \
    --datasets "$1" --results "$2" --keep-proba runs/ucr7/proba2 \
    --reuse-minirocket runs/ucr5/seed1.json --plots "$3" >> runs/ucr7/seed2.log 2>&1
}
[ -n "$first" ] && run "$first" runs/ucr7/seed2.json /tmp/plots7_2a &
[ -n "$second" ] && run "$second" runs/ucr7/seed2_part2.json /tmp/plots7_2b &
wait
echo "seed 2 halves done $(date -u)" >> runs/ucr7/done.log
