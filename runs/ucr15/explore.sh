#!/bin/bash
# round 15's exploration on split 3, two lanes: the net on top of the ridge with its mixer
# (2 layers) and without (0) (runs/ucr15/explore.py); resumable
cd "$(dirname "$0")/../.." || exit 1
SETS="FordA AllGestureWiimoteX AllGestureWiimoteZ ElectricDevices GesturePebbleZ1 Crop ACSF1 CinCECGTorso CricketX CricketY GestureMidAirD3 GestureMidAirD2 Adiac Beef DistalPhalanxOutlineAgeGroup DistalPhalanxTW ArrowHead FacesUCR Coffee ECG200 BirdChicken BME DodgerLoopWeekend ECGFiveDays Chinatown AllGestureWiimoteY Earthquakes EthanolLevel Fish EOGVerticalSignal EOGHorizontalSignal FiftyWords Computers GestureMidAirD1 GesturePebbleZ2 CricketZ DodgerLoopDay ChlorineConcentration FaceAll ECG5000 FreezerRegularTrain DistalPhalanxOutlineCorrect Car FreezerSmallTrain FaceFour BeetleFly CBF DodgerLoopGame DiatomSizeReduction Fungi"
for layers in 2 0; do
  # shellcheck disable=SC2086
  nice -n 5 .venv/bin/python runs/ucr15/explore.py 3 $layers runs/ucr15/split3_layers$layers.json $SETS >> runs/ucr15/lane_$layers.log 2>&1 &
done
wait
echo "explore done $(date)" >> runs/ucr15/done.log
