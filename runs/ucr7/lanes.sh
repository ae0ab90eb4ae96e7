#!/bin/bash
# the fourth configuration (steps=1800) on TEST: seeds 0, 1, 2 with the ablation, two lanes;
# a rerun of this script resumes (ucr.py skips the datasets already in a results file)
cd /work/main
lane() {
  for s in "$@"; do
    nice -n 5 .venv/bin/python benchmarks/ucr.py --method conv --threads 1 --seed $s \
      --results runs/ucr7/seed$s.json --keep-proba runs/ucr7/proba$s \
      --reuse-minirocket runs/ucr5/seed1.json --plots /tmp/plots7_$s >> runs/ucr7/seed$s.log 2>&1
    echo "seed $s done $(date -u)" >> runs/ucr7/done.log
  done
}
lane 0 2 &
lane 1 &
wait
