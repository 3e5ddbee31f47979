#!/usr/bin/env bash
# The one prepared script for a session that is lent a GPU (issue 3 §7, issue 5). Here, first:
#     make gpu-data          # copies Fashion-MNIST into data/FashionMNIST/raw (git-ignored)
# then through the device tool, with timeout_s = SWEEP_SECONDS + about 150:
#     run(command="bash bench/gpu_session.sh", carry=["data/FashionMNIST"])
# It (1) measures client batching on the GPU (bench/gpu_batching.py -> $OUT/gpu_batching.json),
# (2) measures float32 against bfloat16 on the GPU (bench/precision.py --device cuda: matmul
# peaks, client training of the three models, evaluation, whole runs cut to PRECISION_ROUNDS
# rounds -> $OUT/precision_cuda.json; issue 32), (3) spends SWEEP_SECONDS on the paper sweep
# (--device cuda --client-batch 100, WORKERS runs side by side) and packs the runs it finished
# into $OUT/runs.tar.gz. Back here:
#     tar xzf <files_at>/runs.tar.gz && cp <files_at>/gpu_batching.json <files_at>/precision_cuda.json data/results/bench/
# The sweep skips every run already committed and writes each run atomically, so a run cut
# off by the time limit leaves nothing behind.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/gpu-out}
SWEEP_SECONDS=${SWEEP_SECONDS:-360}
PRECISION_ROUNDS=${PRECISION_ROUNDS:-30}
WORKERS=${WORKERS:-6}
PY=${PY:-python3}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" bench/gpu_batching.py --device cuda --out "$OUT/gpu_batching.json" 2>&1 | tee "$OUT/gpu_batching.log"
"$PY" bench/precision.py --device cuda --rounds "$PRECISION_ROUNDS" --out "$OUT/precision_cuda.json" 2>&1 \
    | tee "$OUT/precision_cuda.log"
# DEADLINE_SECONDS (optional): the whole script's budget; the sweep gets what the benchmarks left,
# less 40 s for packing, so the runs it finished always come back.
if [ -n "${DEADLINE_SECONDS:-}" ] && [ $((DEADLINE_SECONDS - SECONDS - 40)) -lt "$SWEEP_SECONDS" ]; then
    SWEEP_SECONDS=$((DEADLINE_SECONDS - SECONDS - 40))
fi
echo "sweep budget ${SWEEP_SECONDS} s"
touch /tmp/fedsteer-sweep-start
timeout "$SWEEP_SECONDS" "$PY" -m fedsteer_lib sweep --profile paper --dataset fmnist --what all \
    --device cuda --client-batch 100 --workers "$WORKERS" > "$OUT/sweep.log" 2>&1
echo "sweep exit status $? (124: stopped at SWEEP_SECONDS, as planned)"
find data/results/runs -name '[0-9a-f]*.json' -newer /tmp/fedsteer-sweep-start > /tmp/fedsteer-new-runs
echo "$(wc -l < /tmp/fedsteer-new-runs) runs finished on the GPU"
tar czf "$OUT/runs.tar.gz" -T /tmp/fedsteer-new-runs
