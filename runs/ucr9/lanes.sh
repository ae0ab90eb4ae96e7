#!/bin/bash
# round 9 on two lanes (runs/ucr9/DECISION.md); resumable: a rerun skips the sets already done
cd "$(dirname "$0")/../.."
nice -n 5 .venv/bin/python benchmarks/ucr_tokens.py --round 9 --datasets Earthquakes,FordA,ACSF1,Fish,EthanolLevel,EOGVerticalSignal,Computers,GestureMidAirD2,CinCECGTorso,CricketX,Car,FiftyWords,Beef,ArrowHead,FaceAll,BirdChicken,FreezerSmallTrain,ECG200,FaceFour,DistalPhalanxOutlineCorrect,Crop,DodgerLoopGame,BME,DiatomSizeReduction,Fungi --results runs/ucr_tokens/round9_A.json > runs/ucr9/lane_A.log 2>&1 &
nice -n 5 .venv/bin/python benchmarks/ucr_tokens.py --round 9 --datasets AllGestureWiimoteY,AllGestureWiimoteX,AllGestureWiimoteZ,GesturePebbleZ1,GesturePebbleZ2,EOGHorizontalSignal,GestureMidAirD3,GestureMidAirD1,FreezerRegularTrain,CricketY,CricketZ,DodgerLoopDay,Adiac,ChlorineConcentration,ECG5000,FacesUCR,BeetleFly,ElectricDevices,Coffee,DistalPhalanxTW,DistalPhalanxOutlineAgeGroup,DodgerLoopWeekend,CBF,ECGFiveDays,Chinatown --results runs/ucr_tokens/round9_B.json > runs/ucr9/lane_B.log 2>&1 &
wait
echo "done $(date)" >> runs/ucr9/done.log
