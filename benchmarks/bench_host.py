r"""bench_host: the host's (CPU, main thread) cost per text of the project's evaluation pass.

A fast GPU leaves the host as the bound: building pairs, de-duplicating and batching texts,
gathering token ids, confidence intervals, the score file. This runs bench.py's project pass
(run_lgip_multi.evaluate) with instant stand-ins for the model (zero embeddings; prefix packs
planned, not computed), the tokenizer (one id per word) and image decoding (a 4x4 image), so what is left is
the project's own Python and numpy, measurable without a GPU: as a run's first model (it
tokenizes, builds the calls and pairs), then as a later one (it finds them made). WIDTH,
DTYPE and CACHE make the stand-in's embeddings as wide, stored and cached as a real model's
(their tables and similarities, on the CPU here, are device work in a GPU run; the cache's
copies and file writes are host work there too, in the writer's thread).
  python benchmarks/bench_host.py                       # 3072 records, ~127k texts: prints us per text
  python benchmarks/bench_host.py --N_IMAGES=512 --REPEATS=5
  python benchmarks/bench_host.py --N_IMAGES=40000 --WIDTH=768 --DTYPE=bf16 --CACHE=True \
    --REPEATS=1                                           # a 40,000-image run's host
"""

import os
import shutil
import sys
import zlib

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project root
sys.path.insert(1, _ROOT)  # common and lgip, when run as python benchmarks/<script>.py
import bench  # noqa: E402
import common  # noqa: E402
import lgip.images  # noqa: E402

N_IMAGES = 3072  # int >= 1: records (synthetic images and demo captions, as bench.py makes them)
REPEATS = 3  # int >= 1: timed passes; the fastest is reported
TEXT_BATCH_SIZE = 2048  # int: texts per batch (2048: "auto" on CUDA, where the host is the bound)
WORK_DIR = None  # scratch folder; None = a temp dir removed at the end
WIDTH = 32  # int: width of the stand-in's embeddings (768: ViT-L-14, SigLIP base; 1024: ViT-H-14, SigLIP large)
DTYPE = "fp32"  # "fp32", or "bf16": embeddings stored as fp16 values,
#   as a bf16 GPU run's (the stand-in computes nothing)
CACHE = False  # True: the embedding cache on, cold at every pass, as a user's first run
CONFIG = common.configure(globals())


def instant_encoder():
    """The fixture's tiny open_clip model with every costly step replaced by an instant one."""
    import torch
    from PIL import Image

    spec = {
        "name": "host",
        "type": "openclip",
        "model_name": "local-dir:" + os.path.join(_ROOT, "tests", "fixtures", "models", "openclip-tiny"),
    }
    enc = common.load_model(spec, "corrected", "cpu")
    enc.dtype = common.resolve_dtype(DTYPE, "cpu")
    zeros = torch.zeros(1, WIDTH)  # expanded, never allocated: the stand-in's own cost stays out
    enc.encode_tokens = lambda ids, exact_length=False: zeros.expand(ids.shape[0], WIDTH)
    enc.encode_packs = lambda *arrays: zeros.expand(len(arrays[-1]), WIDTH)  # prefix packs: planned, not computed
    enc.encode_images = lambda batch: zeros.expand(batch.shape[0], WIDTH)
    enc.image_transform = lambda img: torch.zeros(3, 8, 8)
    # One id per word (a real tokenizer's prefix structure, at no cost): texts that start alike share ids.
    enc.tokenize = lambda texts: [
        [49406] + [1000 + zlib.crc32(w.encode()) % 48000 for w in t.lower().split()][:75] + [49407] for t in texts
    ]
    enc.tokenizer_key = ("bench_host", "one id per word")  # a table of its own, shared by the later passes
    enc.pixels = None  # the stand-in transform above, not the real geometry
    tiny = Image.new("RGB", (4, 4))
    lgip.images.open_rgb = lambda path: tiny  # no JPEG decoding (the decoders' own name for it)
    return spec, enc


def main():
    with bench.scratch_dir(WORK_DIR, "lgip_bench_host_") as work:
        jsonl = bench.make_records(work, N_IMAGES, 0, placeholder_images=True)  # (never decoded)
        records = common.load_records(jsonl, ("same_caps", "diff_caps"))
        spec, enc = instant_encoder()
        cache = os.path.join(work, "cache") if CACHE else None
        config = dict(
            bench.eval_config(jsonl, work, cache),
            NUM_WORKERS=0,
            DEVICE="cpu",
            DTYPE=DTYPE,
            TEXT_BATCH_SIZE=TEXT_BATCH_SIZE,
        )
        for label, fresh in (("first model", True), ("later model", False)):
            times = []
            for _ in range(REPEATS):
                if cache:
                    shutil.rmtree(cache, ignore_errors=True)
                with common.Timer() as t:
                    res = bench.project_pass(enc, spec, records, config, fresh=fresh)
                times.append(t.seconds)
            texts = res["unique_texts_encoded"]
            print(
                f"{len(records)} records, {texts} texts, {label}: host pass {min(times):.3f} s (runs: "
                f"{', '.join(f'{x:.3f}' for x in times)}), {min(times) / texts * 1e6:.2f} us per text, "
                f"phases {res['seconds_by_phase']}"
            )


if __name__ == "__main__":
    common.run_main(main)
