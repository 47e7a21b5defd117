#!/usr/bin/env bash
# Staged deployment run (6 SuperNodes) with a forget request sent during stage 1.
set -u
cd /work/main
RES=/tmp/depres; rm -rf $RES; mkdir -p $RES
LOG=/work/tmp/deploy_forget.log
( SE_DEPLOY_DIR=/tmp ./simulate.sh deploy 6 --run-config "num-stages=3 joins-per-stage=1 requests-per-stage=0 frameworks='SE,FR' mia=false num-rounds=2 local-epochs=1 client-samples=200 test-samples=1000 run-name='dep' results-dir='$RES'" > $LOG 2>&1; echo "deploy exit $?" >> $LOG ) &
for i in $(seq 1 600); do
  if grep -q "stage 1 learn round 1/" $LOG 2>/dev/null; then
    echo "--- forget sent at $(date -u +%T) while stage 1 runs" >> /work/tmp/deploy_forget.cmd
    ./simulate.sh forget --run dep --clients 1 --results-dir $RES >> /work/tmp/deploy_forget.cmd 2>&1
    echo "forget exit $?" >> /work/tmp/deploy_forget.cmd
    break
  fi
  sleep 1
done
wait
./simulate.sh receipts --run dep --results-dir $RES >> /work/tmp/deploy_forget.cmd 2>&1
