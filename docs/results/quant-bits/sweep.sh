#!/usr/bin/env bash
# How coarse a coded history's fixed point may be: the same tiny MNIST run (client 1
# forgotten as planned, SE and SISA) uncoded and coded at several quant-scale-bits.
# Made at b690b6a, before quant-scale-bits below 16 was refused; today's code refuses
# those values, so run it from a checkout of b690b6a (from the project root):
#   git worktree add /tmp/wt b690b6a && ln -s "$PWD/.venv" /tmp/wt/.venv
#   ln -sfn "$PWD/../shared" /tmp/shared   # the data, where /tmp/wt looks for it
#   (cd /tmp/wt && bash "$OLDPWD/docs/results/quant-bits/sweep.sh" /tmp/quant-bits)
#   python3 docs/results/quant-bits/table.py /tmp/quant-bits > docs/results/quant-bits/table.txt
set -u
out=${1:?usage: sweep.sh OUT_DIR}
B="num-clients=8 num-shards=2 clients-per-round=4 num-rounds=3 local-epochs=1 client-samples=100 test-samples=500 mia=false results-dir='$out' forget-clients='1' frameworks='SE,SISA'"
for b in uncoded 1 4 8 12 16 20 24; do
  if [ "$b" = uncoded ]; then extra="storage='uncoded'"; else extra="storage='coded' quant-scale-bits=$b"; fi
  OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python -m cli run --run-config "$B $extra run-name='q$b'" > "$out/q$b.log" 2>&1
  echo "$b rc=$?"
done
