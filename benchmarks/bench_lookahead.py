"""bench_lookahead: what common.Lookahead takes off a run's later models, on a simulated GPU.

A run's first model of a tokenization tokenizes all texts, and its first model of a pixel
geometry decodes all images, while the GPU waits; with LOOKAHEAD the run does that work for
the later models while earlier ones keep the GPU busy. This times bench.at_scale_sequence (one
run_lgip_multi.py process) with and without it, side by side, on real tokenizers (the fixture
models': open_clip's SimpleTokenizer, SigLIP's sentencepiece) and real JPEG decoding of
bench.py's 640x480 images, with the models' forward passes replaced by a simulated device: a
wait per text and per image (the calling thread sleeps, as it does on a busy GPU), no compute.
The sequence: open_clip (first: tokenizes, decodes), its twin (same tokens and pixels), SigLIP
(another tokenization and geometry: the one the lookahead can prepare).
  python benchmarks/bench_lookahead.py                    # 256 records, ~10.6k texts
  python benchmarks/bench_lookahead.py --N_IMAGES=512 --DEVICE_US_PER_TEXT=200
Choose the device times so the twin is device-bound for longer than SigLIP's tokenizing and
decoding take on this machine's workers (on an H100 with 15 workers that holds by far: BENCHMARKS.md).
"""

import os
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project root
sys.path.insert(1, _ROOT)  # common and lgip, when run as python benchmarks/<script>.py
import bench  # noqa: E402
import common  # noqa: E402

N_IMAGES = 256  # int >= 1: records (synthetic 640x480 JPEGs and demo captions, as bench.py makes them)
DEVICE_US_PER_TEXT = 400  # float >= 0: simulated device time per text encoded, microseconds
DEVICE_US_PER_IMAGE = 4000  # float >= 0: simulated device time per image encoded, microseconds
NUM_WORKERS = None  # int: worker processes (decoding, tokenizing, lookahead); None = all CPUs but one
REPEATS = 2  # int >= 1: runs of each setting, alternating; the fastest sequence of each is reported
WORK_DIR = None  # scratch folder; None = a temp dir removed at the end
CONFIG = common.configure(globals())

_FIXTURES = os.path.join(_ROOT, "tests", "fixtures", "models")
SPECS = [
    {"name": "open_clip", "type": "openclip", "model_name": "local-dir:" + os.path.join(_FIXTURES, "openclip-tiny")},
    {
        "name": "open_clip_twin",
        "type": "openclip",
        "model_name": "local-dir:" + os.path.join(_FIXTURES, "openclip-tiny"),
    },
    {"name": "siglip", "type": "siglip", "model_id": os.path.join(_FIXTURES, "siglip-tiny")},
]


def on_simulated_device(spec):
    """The model's Encoder (its tokenizer, geometry, batching) whose forward passes only wait."""
    import torch

    enc = common.load_model(spec, "corrected", "cpu")

    def busy(n, us):
        time.sleep(n * us / 1e6)
        return torch.zeros(n, 32)

    enc.encode_tokens = lambda ids, exact_length=False, **kw: busy(ids.shape[0], DEVICE_US_PER_TEXT)
    if enc.encode_packs is not None:
        enc.encode_packs = lambda *arrays: busy(len(arrays[-1]), DEVICE_US_PER_TEXT)
    enc.encode_images = lambda batch: busy(batch.shape[0], DEVICE_US_PER_IMAGE)
    return enc


def sequence(encs, scale, lookahead):
    bench.LOOKAHEAD = lookahead
    rows = [{"name": s["name"], "published": {"s_per_record": 1.0}} for s in SPECS]
    with common.Timer() as t:
        done = list(bench.at_scale_sequence(list(zip(rows, SPECS, encs)), scale))
    return t.seconds, [r["scale"] for r in done]


def main():
    with bench.scratch_dir(WORK_DIR, "lgip_bench_lookahead_") as work:
        bench.NUM_WORKERS, bench.DEVICE = NUM_WORKERS, "cpu"
        jsonl = bench.make_records(work, N_IMAGES, 0)
        records = common.load_records(jsonl, ("same_caps", "diff_caps"))
        counts = bench.text_counts(records)
        scale = (records, jsonl, work, counts)
        encs = [on_simulated_device(s) for s in SPECS]
        workers = common.default_num_workers() if NUM_WORKERS is None else NUM_WORKERS
        print(
            f"{counts['images']} images, {counts['texts']} texts; {workers} workers; simulated device "
            f"{DEVICE_US_PER_TEXT:g} us/text, {DEVICE_US_PER_IMAGE:g} us/image",
            flush=True,
        )
        best = {}
        for _ in range(REPEATS):
            for lookahead in (False, True):
                total, passes = sequence(encs, scale, lookahead)
                print(
                    f"lookahead {lookahead!s:5s}: {total:.2f} s  ("
                    + ", ".join(f"{s['name']} {p['total_s']:.2f} s" for s, p in zip(SPECS, passes))
                    + ")",
                    flush=True,
                )
                if lookahead not in best or total < best[lookahead][0]:
                    best[lookahead] = (total, passes)
        for lookahead, (total, passes) in best.items():
            last = passes[-1]
            print(
                f"\nlookahead {lookahead}: sequence {total:.2f} s (fastest of {REPEATS}); SigLIP's pass "
                f"{last['total_s']:.2f} s, phases {last['seconds_by_phase']}, images {last['image_sources']}, "
                f"done ahead {last['lookahead']}"
            )
        saved = best[False][0] - best[True][0]
        print(
            f"\nthe lookahead took {saved:.2f} s off the sequence ({best[False][0]:.2f} -> {best[True][0]:.2f} s); "
            f"SigLIP's own pass {best[False][1][-1]['total_s']:.2f} -> {best[True][1][-1]['total_s']:.2f} s"
        )


if __name__ == "__main__":
    common.run_main(main)
