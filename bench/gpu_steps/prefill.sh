#!/usr/bin/env bash
# Issue 50's figures on the GPU, run by ../shared/gpu (`run.sh build06,patch06,prefill,server`):
# encoder + prefill of 1, 8 and 32 rows of 10 s beside the SDK's own forward (GPU waits, CPU
# against CUDA time, operators, host reads), the first call of a new length, then the decode
# step per token at batch 1, 8 and 32. Env from the harness: PY, W, OUT, SHAPE (DEVICE=cpu
# tries it here: `PY=.venv/bin/python W=DIR SHAPE=tiny DEVICE=cpu OUT=/tmp/o bash THIS`).
set -u
model="$W/qwen-${SHAPE:-0.6b}"
device=${DEVICE:-cuda}
echo "== prefill $SHAPE on $device"
timeout 200 "$PY" bench/prefill.py --device "$device" --checkpoint "$model" --rows 1,8,32 \
  2>&1 | grep -v USDT | tee "$OUT/prefill-$SHAPE.txt" || echo "prefill bench failed: $?"
echo "== decode steps $SHAPE on $device"
timeout 200 "$PY" bench/decode_steps.py --device "$device" --checkpoint "$model" \
  --batches 1,8,32 --repeat 3 2>&1 | tee "$OUT/decode-$SHAPE.txt" || echo "decode bench failed: $?"
