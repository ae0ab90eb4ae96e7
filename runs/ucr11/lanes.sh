#!/bin/bash
# round 11 on two lanes (runs/ucr11/DECISION.md); resumable: a rerun skips the sets already done
cd "$(dirname "$0")/../.." || exit 1
nice -n 5 .venv/bin/python benchmarks/ucr_tokens.py --round 11 --datasets FordA,AllGestureWiimoteX,AllGestureWiimoteZ,ElectricDevices,GesturePebbleZ1,Crop,ACSF1,CinCECGTorso,CricketX,CricketY,GestureMidAirD3,GestureMidAirD2,Adiac,Beef,DistalPhalanxOutlineAgeGroup,DistalPhalanxTW,ArrowHead,FacesUCR,Coffee,ECG200,BirdChicken,BME,DodgerLoopWeekend,ECGFiveDays,Chinatown --results runs/ucr_tokens/round11_A.json >> runs/ucr11/lane_A.log 2>&1 &
nice -n 5 .venv/bin/python benchmarks/ucr_tokens.py --round 11 --datasets AllGestureWiimoteY,Earthquakes,EthanolLevel,Fish,EOGVerticalSignal,EOGHorizontalSignal,FiftyWords,Computers,GestureMidAirD1,GesturePebbleZ2,CricketZ,DodgerLoopDay,ChlorineConcentration,FaceAll,ECG5000,FreezerRegularTrain,DistalPhalanxOutlineCorrect,Car,FreezerSmallTrain,FaceFour,BeetleFly,CBF,DodgerLoopGame,DiatomSizeReduction,Fungi --results runs/ucr_tokens/round11_B.json >> runs/ucr11/lane_B.log 2>&1 &
wait
echo "done $(date)" >> runs/ucr11/done.log
