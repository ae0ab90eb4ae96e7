#!/bin/bash
# the fourth configuration on TEST, seeds 1 and 2 without the ablation (seed 0 keeps it, in
# lanes.sh); a rerun resumes. Seed 1's first rows were fitted with the ablation, which was
# dropped from them when this lane replaced lanes.sh's second (the model fits are the same).
cd "$(dirname "$0")/../.." || exit 1
for s in 1 2; do
  nice -n 5 .venv/bin/python benchmarks/ucr.py --method conv --threads 1 --seed $s --no-ablation \
    --results runs/ucr7/seed$s.json --keep-proba runs/ucr7/proba$s \
    --reuse-minirocket runs/ucr5/seed1.json --plots /tmp/plots7_$s >> runs/ucr7/seed$s.log 2>&1 \
    && echo "seed $s done $(date -u)" >> runs/ucr7/done.log
done
