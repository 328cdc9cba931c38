#!/usr/bin/env bash
# One lent GPU's checks, prepared here and run there in one call (device time is 15 minutes a
# session, machine start included): BENCHMARKS.md's GPU section reads what it prints.
#   bash benchmarks/gpu_session.sh [OUT_DIR] [SECONDS]     # default: $OUT (the device tool's) or /tmp/lgip_gpu, 470 s
# In order of what each proves, each stage under a time limit so one that hangs cannot take the
# later ones with it (the stages share the SECONDS given):
#  1. the GPU-marked tests (pixels bit-identical on the device; tables and similarities on the
#     GPU equal to the CPU's; cached re-runs equal; the joint scorers' figures on the GPU equal to
#     the CPU's, every generative acceleration on);
#  2. benchmarks/bench_generative.py with LLaVA-1.5-7B's architecture (random init, bf16: no download):
#     one plain forward per text, the processor per text on the reused prefix (the code before
#     2026-11-28), spliced conversations in batches, spliced and packed, and run_lgip_multi's
#     evaluation with the model in memory (the joint scorer, JOINT_PIPELINE on and off, the self-check);
#     the paper's job projected from it;
#  3. benchmarks/bench.py for the published architectures (random init, real cost): the project
#     path against the published-style loop, the at-scale sequence with the lookahead and again
#     without it in the same process, where every thread of the process is during ViT-L-14's pass
#     (STACKS), the lookahead's jobs against each pass, the 40,000-image projection; its results
#     file lands in OUT_DIR.
#  5. benchmarks/bench_finetune.py (ViT-B-16, bf16, batch 128): open_clip's step, the plain arm, the LGIP arm;
#  6. benchmarks/bench_classification.py (LGIP_SPEC.md 16): run_lgip_classification.py against CLIP_benchmark's
#     zero_shot_classifier + run_classification on ViT-B-16 (random init), 1,000 ImageNet class names x 80
#     templates, cold and re-run from the cache; the tiny LLaVA's classes per second with prefix reuse on and off.
# RUN_ALL=1 adds the older stage: one whole-process run_all.py on generated records with two
# real-size models (DEVICE=auto, DTYPE=auto). Packages the device machine lacks travel as wheels in
# .whl/ (the device tool's README).
set -u
OUT_DIR=${1:-${OUT:-/tmp/lgip_gpu}}
BUDGET=${2:-470}
BENCH_ARGS=${BENCH_ARGS:-"--N_IMAGES=4 --SCALE_IMAGES=3072 --REPEATS=1 --AND_WITHOUT_LOOKAHEAD=True --STACKS=bench_ViT-L-14"}
CLS_ARGS=${CLS_ARGS:-"--N_IMAGES=2048 --BATCH=256 --NUM_WORKERS=12"}
GEN_ARGS=${GEN_ARGS:-"--N_IMAGES=16 --BEFORE_IMAGES=1 --RECORDS=48 --PIPELINE_IMAGES=48 --PROFILE=True"}
RUN_ALL_RECORDS=${RUN_ALL_RECORDS:-128}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
end=$((SECONDS + BUDGET))
left() { local l=$((end - SECONDS)); if [ "$l" -gt "$1" ]; then echo "$1"; else echo $((l > 5 ? l : 5)); fi; }
stage() { echo; echo "=== $1 (t=${SECONDS}s) ==="; }

stage "environment"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
python3 - <<'PY'
import os, platform, torch, transformers, open_clip, numpy, PIL
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "transformers", transformers.__version__, "open_clip", open_clip.__version__, "numpy", numpy.__version__,
      "pillow", PIL.__version__, "cpus", os.cpu_count())
print("device", torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).multi_processor_count, "SMs")
PY
echo "commit ${LGIP_COMMIT:-unknown}"

stage "1. GPU-marked tests"
timeout "$(left 110)" python3 -m pytest -q -p no:cacheprovider -n 3 tests/test_device.py tests/test_images.py \
  "tests/test_joint.py::test_joint_scorers_on_the_gpu_give_the_cpus_figures" 2>&1 | tail -15
echo "tests exit: ${PIPESTATUS[0]}"

stage "2. bench_generative.py, LLaVA-1.5-7B's architecture, random init, bf16 ($GEN_ARGS)"
timeout "$(left 150)" python3 benchmarks/bench_generative.py --ARCH=llava-1.5-7b --DEVICE=cuda --DTYPE=bf16 $GEN_ARGS \
  2>&1 | grep -v -E "^override:" | tee "$OUT_DIR/bench_generative.log" | tail -25
echo "bench_generative exit: ${PIPESTATUS[0]}"
nvidia-smi --query-gpu=memory.used,temperature.gpu --format=csv,noheader

stage "3. bench.py $BENCH_ARGS"
timeout "$(left 300)" python3 benchmarks/bench.py $BENCH_ARGS --RESULTS_JSON="$OUT_DIR/bench_results.json" 2>&1 \
  | grep -v -E "^override:|No pretrained weights|slow image processor" > "$OUT_DIR/bench.log"
echo "bench exit: ${PIPESTATUS[0]}"
grep -E "^(bench_|siglip|  pass from|  stacks|    MainThread|    Thread|  speed-up at scale|at scale:|projection|  nine)" \
  "$OUT_DIR/bench.log" | cut -c1-400 | tail -70
tail -25 "$OUT_DIR/bench.log"

if [ "${RUN_ALL:-0}" = 1 ]; then
stage "4. run_all.py, $RUN_ALL_RECORDS generated records, two real-size models"
WORK=/tmp/lgip_gpu_run_all
rm -rf "$WORK"
timeout "$(left 60)" python3 - "$WORK" "$RUN_ALL_RECORDS" <<'PY'
import sys
sys.argv, work, n = sys.argv[:1], sys.argv[1], int(sys.argv[2])
sys.path.insert(0, "benchmarks")
import bench
bench.make_records(work, n, 0)
bench.make_siglip_folder("siglip-base-patch16-224", f"{work}/models/siglip-base-patch16-224", 0)
PY
MODELS="[{'name': 'b16', 'type': 'openclip', 'model_name': 'ViT-B-16', 'pretrained': None}, \
{'name': 'siglip_b224', 'type': 'siglip', 'model_id': '$WORK/models/siglip-base-patch16-224'}]"
timeout "$(left 200)" python3 run_all.py --DATA=coco --BASE_JSONL="$WORK/bench_base.jsonl" --MODELS="$MODELS" \
  --SETTINGS="{'BOOTSTRAP': 200}" > "$OUT_DIR/run_all.log" 2>&1
echo "run_all exit: $?"
grep -E "^\[[0-9]+/11\]|invariance error|Error|error:|Traceback|run_all:" "$OUT_DIR/run_all.log" | cut -c1-300 | tail -40
fi
stage "5. bench_finetune.py, ViT-B-16 at bf16, batch 128 (open_clip's step, the plain arm, the LGIP arm)"
timeout "$(left 120)" python3 benchmarks/bench_finetune.py --ARCHS="['ViT-B-16']" --BATCH_SIZES="{'ViT-B-16': 128}" \
  --DEVICE=cuda --STEPS=5 2>&1 | grep -v -E "^override:" | tee "$OUT_DIR/bench_finetune.log" | tail -6
nvidia-smi --query-gpu=memory.used,temperature.gpu --format=csv,noheader
stage "6. bench_classification.py: ViT-B-16 at random init, 1,000 classes x 80 templates ($CLS_ARGS)"
timeout "$(left 150)" python3 benchmarks/bench_classification.py --DEVICE=cuda $CLS_ARGS 2>&1 \
  | grep -v -E "^override:" | tee "$OUT_DIR/bench_classification.log" | grep -E "^(ViT|CLIP|run_lgip|ratio|generative)"
echo "bench_classification exit: ${PIPESTATUS[0]}"
echo "=== done (t=${SECONDS}s) ==="
