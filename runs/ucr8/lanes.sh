#!/bin/bash
# round 8 (runs/ucr8/DECISION.md) in two processes; a rerun resumes (finished datasets skipped)
cd "$(dirname "$0")/../.." || exit 1
nice -n 5 .venv/bin/python benchmarks/ucr_tokens.py --round 8 --datasets ElectricDevices,EthanolLevel,EOGVerticalSignal,Computers,Earthquakes,Fish,AllGestureWiimoteZ,DistalPhalanxTW,FiftyWords,FaceAll,DistalPhalanxOutlineAgeGroup,GestureMidAirD3,CricketZ,DistalPhalanxOutlineCorrect,DodgerLoopDay,CricketY,Beef,ArrowHead,Car,BME,CBF,DodgerLoopWeekend,BeetleFly,ECGFiveDays,Fungi \
  --results runs/ucr_tokens/round8_A.json > runs/ucr8/A.log 2>&1 &
nice -n 5 .venv/bin/python benchmarks/ucr_tokens.py --round 8 --datasets FordA,Crop,EOGHorizontalSignal,AllGestureWiimoteX,GestureMidAirD1,CinCECGTorso,GesturePebbleZ1,ChlorineConcentration,AllGestureWiimoteY,GestureMidAirD2,Adiac,ECG5000,FreezerRegularTrain,CricketX,ACSF1,GesturePebbleZ2,FacesUCR,ECG200,FreezerSmallTrain,Coffee,FaceFour,Chinatown,BirdChicken,DiatomSizeReduction,DodgerLoopGame \
  --results runs/ucr_tokens/round8_B.json > runs/ucr8/B.log 2>&1 &
wait
echo "round 8 done $(date -u)" >> runs/ucr8/done.log
