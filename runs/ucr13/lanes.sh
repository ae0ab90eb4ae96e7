#!/bin/bash
# round 13 on two lanes, one split each (runs/ucr13/DECISION.md); resumable: a rerun skips
# the sets already done
cd "$(dirname "$0")/../.." || exit 1
SETS="FordA AllGestureWiimoteX AllGestureWiimoteZ ElectricDevices GesturePebbleZ1 Crop ACSF1 CinCECGTorso CricketX CricketY GestureMidAirD3 GestureMidAirD2 Adiac Beef DistalPhalanxOutlineAgeGroup DistalPhalanxTW ArrowHead FacesUCR Coffee ECG200 BirdChicken BME DodgerLoopWeekend ECGFiveDays Chinatown AllGestureWiimoteY Earthquakes EthanolLevel Fish EOGVerticalSignal EOGHorizontalSignal FiftyWords Computers GestureMidAirD1 GesturePebbleZ2 CricketZ DodgerLoopDay ChlorineConcentration FaceAll ECG5000 FreezerRegularTrain DistalPhalanxOutlineCorrect Car FreezerSmallTrain FaceFour BeetleFly CBF DodgerLoopGame DiatomSizeReduction Fungi"
for s in 3 4; do
  # shellcheck disable=SC2086
  nice -n 5 .venv/bin/python runs/ucr13/round13.py $s runs/ucr13/split$s.json $SETS >> runs/ucr13/lane_$s.log 2>&1 &
done
wait
echo "done $(date)" >> runs/ucr13/done.log
