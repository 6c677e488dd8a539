#!/usr/bin/env bash
# #72's GPU measurements on one GPU machine, in one go (the results of each step under OUT):
#   bash bench/mfu_run.sh OUT TOKENIZER_DIR
# 1. bench/specs/mfu_batch.yaml through the local backend (bench/showcase.py): the best fine-tuning recipe at
#    batch 256 to 2,048, each trial with its FLOPs, TFLOP/s, MFU against the dense peak and its own GEMM probe;
# 2. bench/step_profile.py: the same step replayed under torch.profiler at batch 256 and 1,024, and the inference
#    forward at batch 8 (padded to 128, one CUDA graph: the committed best batch-8 cell) and at batch 256.
set -u
out=${1:?OUT}; tok=${2:?TOKENIZER_DIR}
mkdir -p "$out"
here=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$here:/tmp/kubesweep-site" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv > "$out/gpu.csv" 2>&1
python3 "$here/bench/showcase.py" run --spec "$here/bench/specs/mfu_batch.yaml" --tokenizer "$tok" \
  --out "$out/batch" > "$out/batch.log" 2>&1
for b in 256 1024; do
  python3 "$here/bench/step_profile.py" --tokenizer "$tok" --out "$out/profile-train-bs$b" --set batch_size=$b \
    > "$out/profile-train-bs$b.log" 2>&1
done
python3 "$here/bench/step_profile.py" --tokenizer "$tok" --out "$out/profile-infer-bs8" --set task=inference \
  --set batch_size=8 --set padding=max_length --set compile=false > "$out/profile-infer-bs8.log" 2>&1
python3 "$here/bench/step_profile.py" --tokenizer "$tok" --out "$out/profile-infer-bs256" --set task=inference \
  --set batch_size=256 --set compile=false > "$out/profile-infer-bs256.log" 2>&1
touch "$out/done"
