#!/usr/bin/env bash
# One lent GPU's checks, prepared here and run there in one call (device time is 15 minutes a
# session, machine start included): BENCHMARKS.md's GPU section reads what it prints.
#   bash benchmarks/gpu_session.sh [OUT_DIR] [SECONDS]     # default: $OUT (the device tool's) or /tmp/lgip_gpu, 430 s
# In order of what each proves, each stage under a time limit so one that hangs cannot take the
# later ones with it (the stages share the SECONDS given):
#  1. the GPU-marked tests (pixels bit-identical on the device; tables and similarities on the
#     GPU equal to the CPU's; cached re-runs equal);
#  2. benchmarks/bench.py for the published architectures (random init, real cost): the
#     project path against the published-style loop, the at-scale sequence, the 40,000-image
#     projection; its results file lands in OUT_DIR;
#  3. one whole-process run_all.py on generated records with two real-size models (open_clip
#     ViT-B-16 and a SigLIP base of the published sizes, random init) on DEVICE=auto, DTYPE=auto:
#     every step's CUDA path end to end (bf16 defaults, pinned uploads, the report);
#  4. benchmarks/bench_generative.py with LLaVA-1.5-7B's architecture (random init, bf16: no download),
#     the shared prefix once against one forward per text, and the paper's job projected from it.
# Packages the device machine lacks travel as wheels in .whl/ (the device tool's README).
set -u
OUT_DIR=${1:-${OUT:-/tmp/lgip_gpu}}
BUDGET=${2:-430}
BENCH_ARGS=${BENCH_ARGS:-"--N_IMAGES=32 --SCALE_IMAGES=3072 --REPEATS=1"}
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
python3 - <<'EOF'
import os, platform, torch, transformers, open_clip, numpy, PIL
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "transformers", transformers.__version__, "open_clip", open_clip.__version__, "numpy", numpy.__version__,
      "pillow", PIL.__version__, "cpus", os.cpu_count())
print("device", torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).multi_processor_count, "SMs")
EOF

stage "1. GPU-marked tests"
timeout "$(left 90)" python3 -m pytest -q -p no:cacheprovider -n 2 tests/test_device.py tests/test_images.py 2>&1 | tail -15
echo "tests exit: ${PIPESTATUS[0]}"

stage "2. bench.py $BENCH_ARGS"
timeout "$(left 280)" python3 benchmarks/bench.py $BENCH_ARGS --RESULTS_JSON="$OUT_DIR/bench_results.json" 2>&1 \
  | grep -v -E "^override:|No pretrained weights|slow image processor" > "$OUT_DIR/bench.log"
echo "bench exit: ${PIPESTATUS[0]}"
tail -60 "$OUT_DIR/bench.log"

stage "3. run_all.py, $RUN_ALL_RECORDS generated records, two real-size models"
WORK=/tmp/lgip_gpu_run_all
rm -rf "$WORK"
timeout "$(left 60)" python3 - "$WORK" "$RUN_ALL_RECORDS" <<'EOF'
import sys
sys.argv, work, n = sys.argv[:1], sys.argv[1], int(sys.argv[2])
sys.path.insert(0, "benchmarks")
import bench
bench.make_records(work, n, 0)
bench.make_siglip_folder("siglip-base-patch16-224", f"{work}/models/siglip-base-patch16-224", 0)
EOF
MODELS="[{'name': 'b16', 'type': 'openclip', 'model_name': 'ViT-B-16', 'pretrained': None}, \
{'name': 'siglip_b224', 'type': 'siglip', 'model_id': '$WORK/models/siglip-base-patch16-224'}]"
timeout "$(left 200)" python3 run_all.py --DATA=coco --BASE_JSONL="$WORK/bench_base.jsonl" --MODELS="$MODELS" \
  --SETTINGS="{'BOOTSTRAP': 200}" > "$OUT_DIR/run_all.log" 2>&1
echo "run_all exit: $?"
grep -E "^\[[0-9]+/11\]|invariance error|Error|error:|Traceback|run_all:" "$OUT_DIR/run_all.log" | cut -c1-300 | tail -40
(cd "$WORK" && tar czf "$OUT_DIR/run_all_outputs.tgz" --exclude=images --exclude=models --exclude=.lgip_cache . 2>/dev/null)

stage "4. bench_generative.py, LLaVA-1.5-7B's architecture, random init, bf16"
timeout "$(left 150)" python3 benchmarks/bench_generative.py --ARCH=llava-1.5-7b --DEVICE=cuda --DTYPE=bf16 \
  --N_IMAGES=${GEN_IMAGES:-4} 2>&1 | grep -v -E "^override:" | tail -12
echo "bench_generative exit: ${PIPESTATUS[0]}"
nvidia-smi --query-gpu=memory.used,temperature.gpu --format=csv,noheader
echo "=== done (t=${SECONDS}s) ==="
