#!/bin/bash
# the fourth configuration (steps=1800) on TEST, seed 0 with the ablation (seeds 1 and 2
# without it: lanes_b.sh, run beside this); a rerun resumes (ucr.py skips finished datasets)
cd "$(dirname "$0")/../.." || exit 1
nice -n 5 .venv/bin/python benchmarks/ucr.py --method conv --threads 1 --seed 0 \
  --results runs/ucr7/seed0.json --keep-proba runs/ucr7/proba0 \
  --reuse-minirocket runs/ucr5/seed1.json --plots /tmp/plots7_0 >> runs/ucr7/seed0.log 2>&1 \
  && echo "seed 0 done $(date -u)" >> runs/ucr7/done.log
