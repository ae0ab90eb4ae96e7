#!/bin/bash
# round 14's exploration on two lanes, splits 1 and 2 (runs/ucr14/explore.py); resumable
cd "$(dirname "$0")/../.." || exit 1
SETS="FordA AllGestureWiimoteX AllGestureWiimoteZ ElectricDevices GesturePebbleZ1 Crop ACSF1 CinCECGTorso CricketX CricketY GestureMidAirD3 GestureMidAirD2 Adiac Beef DistalPhalanxOutlineAgeGroup DistalPhalanxTW ArrowHead FacesUCR Coffee ECG200 BirdChicken BME DodgerLoopWeekend ECGFiveDays Chinatown AllGestureWiimoteY Earthquakes EthanolLevel Fish EOGVerticalSignal EOGHorizontalSignal FiftyWords Computers GestureMidAirD1 GesturePebbleZ2 CricketZ DodgerLoopDay ChlorineConcentration FaceAll ECG5000 FreezerRegularTrain DistalPhalanxOutlineCorrect Car FreezerSmallTrain FaceFour BeetleFly CBF DodgerLoopGame DiatomSizeReduction Fungi"
for s in 1 2; do
  # shellcheck disable=SC2086
  nice -n 5 .venv/bin/python runs/ucr14/explore.py $s runs/ucr14/explore$s.json $SETS >> runs/ucr14/explore_$s.log 2>&1 &
done
wait
echo "explore done $(date)" >> runs/ucr14/done.log
