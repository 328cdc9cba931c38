"""bench_retrieval: what run_lgip_retrieval.py costs beside run_lgip_by_fliptype.py on the same records,
measured without a GPU with bench_host.py's instant stand-ins for the model (embeddings made, never
computed; images never decoded).

Runs, as run_all.py does, run_lgip_by_fliptype's pass (cache on and cold: it encodes and caches every
text and image) and then, as a fresh process would, run_lgip_retrieval's pass for each GALLERY_SIZES
entry (every embedding read from the cache; its galleries searched on the CPU), and prints each
pass's seconds by phase. The stand-in's embeddings are random unit vectors, a distinct one for each
image and each text encoded (the search merges embeddings that are equal byte for byte, so equal
stand-ins would leave it one column to search; COCO's texts and images are distinct). On a GPU the
searches' matrix products are device work; here they run on the 2 CPU cores, so WIDTH=32 shows the
host's own cost and WIDTH=768 adds the products a GPU would do (their count is printed).
  python benchmarks/bench_retrieval.py                                              # 3072 records
  python benchmarks/bench_retrieval.py --N_IMAGES=40000 --WIDTH=768 --DTYPE=bf16    # a 40,000-image run
"""

import os
import subprocess
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project root
sys.path.insert(1, _ROOT)  # common and lgip, when run as python benchmarks/<script>.py
import bench  # noqa: E402
import bench_host  # noqa: E402
import common  # noqa: E402

N_IMAGES = 3072  # int >= 1: records (synthetic, as bench.py makes them; their flips by make_perturb_with_fliptypes.py)
WIDTH = 32  # int: width of the stand-in's embeddings (768: ViT-L-14, SigLIP base; 1024: ViT-H-14, SigLIP large)
DTYPE = "fp32"  # "fp32", or "bf16": embeddings stored as fp16 values, as a bf16 GPU run's
GALLERY_SIZES = [
    5000,
    None,
]  # list of GALLERY_SIZE values to time the retrieval with (None: one gallery of all records)
WORK_DIR = None  # scratch folder; None = a temp dir removed at the end
CONFIG = common.configure(globals())


def stand_in():
    """bench_host's instant encoder at this WIDTH and DTYPE, its images and texts random unit vectors."""
    import torch

    bench_host.WIDTH, bench_host.DTYPE = WIDTH, DTYPE
    spec, enc = bench_host.instant_encoder()
    gen = torch.Generator().manual_seed(0)
    unit = lambda n: torch.nn.functional.normalize(torch.randn(n, WIDTH, generator=gen), dim=1)
    enc.encode_images = lambda batch: unit(batch.shape[0])
    enc.encode_tokens = lambda ids, exact_length=False: unit(ids.shape[0])
    enc.encode_packs = lambda *arrays: unit(len(arrays[-1]))
    return spec, enc


def product_count(m, width):
    """Multiply-adds of a search: its queries times their gallery columns, at most (texts counted as
    items, before repeats are merged), times the width."""
    per_block = m["num_samples"] / m["num_blocks"]
    texts = (m["num_captions"] + 2 * m["num_flips"]) / m["num_blocks"]  # captions, flips, typed flips
    text_queries = (m["num_captions"] + m["num_paraphrases"]) / m["num_blocks"]
    return m["num_blocks"] * (per_block * texts + text_queries * per_block) * width


def main():
    import run_lgip_by_fliptype
    import run_lgip_retrieval

    with bench.scratch_dir(WORK_DIR, "lgip_bench_retrieval_") as work:
        bench.make_records(work, N_IMAGES, 0, placeholder_images=True)  # (never decoded)
        base = os.path.join(work, "bench_base.jsonl")
        proc = subprocess.run(
            [sys.executable, os.path.join(_ROOT, "make_perturb_with_fliptypes.py"), f"--INPUT_JSONL={base}"],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise SystemExit(f"make_perturb_with_fliptypes.py failed:\n{proc.stdout}\n{proc.stderr}")
        jsonl = common.default_output(base, "_with_fliptypes.jsonl")
        records = common.load_records(jsonl, run_lgip_by_fliptype.FIELDS)
        spec, enc = stand_in()
        config = dict(
            bench.eval_config(jsonl, work, os.path.join(work, "cache")),
            NUM_WORKERS=0,
            DEVICE="cpu",
            DTYPE=DTYPE,
            TEXT_BATCH_SIZE=2048,
            BOOTSTRAP=1000,
            BOOTSTRAP_SEED=0,
            PROTOCOL="corrected",
        )
        run_lgip_by_fliptype.JSONL_PATH = jsonl  # its score file goes beside the records
        m, seconds, phases = bench.one_pass(run_lgip_by_fliptype, spec, enc, records, config)
        print(
            f"{len(records)} records, width {WIDTH}, {DTYPE}: run_lgip_by_fliptype pass {seconds:.2f} s "
            f"({m['global_sensitivity']['count']:,} flips scored), phases {phases}",
            flush=True,
        )
        for size in GALLERY_SIZES:
            m, seconds, phases = bench.one_pass(run_lgip_retrieval, spec, enc, records, dict(config, GALLERY_SIZE=size))
            print(
                f"{len(records)} records, width {WIDTH}, {DTYPE}: run_lgip_retrieval pass, GALLERY_SIZE={size} "
                f"({m['num_blocks']} galleries; {m['num_captions']:,} captions, {m['num_flips']:,} flips, "
                f"{m['num_paraphrases']:,} paraphrases; {product_count(m, WIDTH) / 1e9:,.0f} G multiply-adds at "
                f"most): {seconds:.2f} s, phases {phases} (retrieval_*: the search's parts)",
                flush=True,
            )


if __name__ == "__main__":
    common.run_main(main)
