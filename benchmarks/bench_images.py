"""bench_images: what run_lgip_images.py costs beside run_lgip_multi.py, on the same records and model.

Per model of MODELS (loaded once, its load time printed and never counted), each pass through
common.ModelRun and the script's own evaluate, in a fresh process state (no token tables, no
remembered pixels), as run_all.py runs them:
  - run_lgip_multi's pass, cache on and cold (its captions, paraphrases, flips and images encoded);
  - run_lgip_images' pass after it, on that cache: the captions and original images read from it,
    the altered images (one per kind and record) made in the loader's workers and encoded: its cost
    in a run_all run;
  - run_lgip_images' pass alone, on a cold cache of its own (captions and originals encoded too);
  - the original images alone, decoded and encoded once (no cache): the cost of one image encoding,
    against which the altered images' is set (KINDS x records of them).
Prints each pass's seconds and phases. Records: N_IMAGES synthetic 640x480 JPEGs, captions of
demo/lgip_demo.jsonl (bench.py's), perturbed by diff_gen_caption.py.
  python benchmarks/bench_images.py                                # the demo model and ViT-B-16 (random init), CPU
  python benchmarks/bench_images.py --N_IMAGES=256 --MODELS="['demo']"
"""

import os
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project root
sys.path.insert(1, _ROOT)  # common and lgip, when run as python benchmarks/<script>.py
import bench  # noqa: E402
import common  # noqa: E402

N_IMAGES = 32  # int >= 1: records (synthetic 640x480 JPEGs, the demo's captions)
MODELS = [  # model specs or names; pretrained None = random init (the same cost as trained weights)
    "demo",
    {"name": "bench_ViT-B-16", "type": "openclip", "model_name": "ViT-B-16", "pretrained": None},
]
KINDS = ["jpeg", "downscale", "crop", "hflip", "mix", "patch"]  # run_lgip_images.py's KINDS
DEVICE = "auto"  # "auto" (cuda if available), "cpu", "cuda", ...
DTYPE = "auto"  # "auto" (bf16 on CUDA, fp32 on CPU), "fp32", "bf16", "fp16"
NUM_WORKERS = None  # int: image-decoding (and altering) worker processes; None = from the CPU count
BOOTSTRAP = 1000  # int >= 0: the evaluations' bootstrap resamples
WORK_DIR = None  # scratch folder; None = a temp dir removed at the end
CONFIG = common.configure(globals())


def main():
    import run_lgip_images
    import run_lgip_multi
    from lgip.models.registry import expand_models

    specs = expand_models(MODELS)
    with bench.scratch_dir(WORK_DIR, "lgip_bench_images_") as work:
        jsonl = bench.make_records(work, N_IMAGES, 0)
        records = common.load_records(jsonl, ("same_caps", "diff_caps"))
        for script in (run_lgip_multi, run_lgip_images):  # their score files go beside the records
            script.JSONL_PATH, script.BOOTSTRAP = jsonl, BOOTSTRAP
        run_lgip_images.KINDS = common.check_kinds(KINDS)
        base = dict(
            bench.eval_config(jsonl, work),
            DEVICE=DEVICE,
            DTYPE=DTYPE,
            NUM_WORKERS=NUM_WORKERS,
            IMAGE_BATCH_SIZE=64,
            TEXT_BATCH_SIZE="auto",
            GALLERY_SIZE=5000,
            PIXEL_MEMORY_GB="auto",
        )
        workers = common.default_num_workers() if NUM_WORKERS is None else NUM_WORKERS
        print(
            f"{len(records)} records ({N_IMAGES} synthetic 640x480 JPEGs), kinds {', '.join(run_lgip_images.KINDS)}, "
            f"{os.cpu_count()} CPUs, {workers} decoding worker(s)",
            flush=True,
        )
        for spec in specs:
            with common.Timer() as t_load:
                enc = common.load_model(spec, "corrected", DEVICE, DTYPE)
            print(
                f"{spec['name']}: loaded in {t_load.seconds:.1f} s ({enc.device}, {str(enc.dtype)[6:]}; not counted)",
                flush=True,
            )
            shared = dict(base, CACHE_DIR=os.path.join(work, f"cache_{spec['name']}"))
            alone = dict(base, CACHE_DIR=os.path.join(work, f"cache_{spec['name']}_images_alone"))
            m, multi_s, phases = bench.one_pass(run_lgip_multi, spec, enc, records, shared)
            print(
                f"  run_lgip_multi pass (cold cache): {multi_s:.2f} s "
                f"({m['num_invariance_pairs'] + m['num_sensitivity_pairs']:,} pairs), phases {phases}",
                flush=True,
            )
            m, after_s, phases = bench.one_pass(run_lgip_images, spec, enc, records, shared)
            made, altered_s = m["altered_images"], phases["altered_images"]
            print(
                f"  run_lgip_images pass after it (captions and originals from its cache): {after_s:.2f} s, "
                f"{made['num']} altered images ({made['decoded']} made and encoded, {made['from_cache']} cached), "
                f"altered_images phase {altered_s:.2f} s = {altered_s / max(made['num'], 1) * 1000:.1f} "
                f"ms per altered image; x{after_s / multi_s:.2f} the run_lgip_multi pass; phases {phases}",
                flush=True,
            )
            m, cold_s, phases = bench.one_pass(run_lgip_images, spec, enc, records, alone)
            print(f"  run_lgip_images pass alone (cold cache of its own): {cold_s:.2f} s; phases {phases}", flush=True)
            common.forget_pixels()
            t0 = time.perf_counter()
            _, ok, _ = common.encode_record_images(enc, records, work, 64, workers)
            once = time.perf_counter() - t0
            print(
                f"  the {len(ok)} original images decoded and encoded once: {once:.2f} s = "
                f"{once / len(ok) * 1000:.1f} ms per image; the altered images (the pass after run_lgip_multi): "
                f"x{altered_s / max(once, 1e-9):.2f} that for {made['num'] / len(ok):.2f} images per record",
                flush=True,
            )


if __name__ == "__main__":
    common.run_main(main)
