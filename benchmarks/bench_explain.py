r"""bench_explain: what F-CLIPScore costs explain_flips.py: each explained flip's caption attributed
as its flip is (one forward and one backward pass per distinct text, captions shared by several
flips of a record once), and the detection figures (average precision by s and by F with their
intervals), beside the flips' own attribution.

On the same records and model (loaded once): the flips alone are attributed (what word attribution
needs), then the flips and their captions (what F-CLIPScore adds), alternating, REPEATS times each;
prints texts attributed (= backward passes), seconds and the ratio, then the detection figures'
seconds over the lines. Records: N_IMAGES synthetic images with the demo's captions (bench.py's),
flips by make_perturb_with_fliptypes.py.
  python benchmarks/bench_explain.py                              # the fixture's tiny open_clip, CPU
  python benchmarks/bench_explain.py \
    --MODEL="{'name': 'b16', 'type': 'openclip', 'model_name': 'ViT-B-16', 'pretrained': None}"
"""

import os
import subprocess
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project root
sys.path.insert(1, _ROOT)  # common and lgip, when run as python benchmarks/<script>.py
import bench  # noqa: E402
import common  # noqa: E402
from lgip import explain  # noqa: E402

N_IMAGES = 64  # int >= 1: records (synthetic 640x480 JPEGs, the demo's captions)
N_FLIPS = 300  # int >= 1: flips explained (drawn with seed 0, as explain_flips.py draws them)
MODEL = {  # model spec
    "name": "tiny",
    "type": "openclip",
    "model_name": "local-dir:" + os.path.join(_ROOT, "demo", "model"),
}
DEVICE = "auto"  # "auto", "cpu", "cuda", ...
REPEATS = 3  # int >= 1: timed runs of each setting, alternating; the fastest is reported
WORK_DIR = None  # scratch folder; None = a temp dir removed at the end
CONFIG = common.configure(globals())


def main():
    import random

    with bench.scratch_dir(WORK_DIR, "lgip_bench_explain_") as work:
        bench.make_records(work, N_IMAGES, 0)
        base = os.path.join(work, "bench_base.jsonl")
        subprocess.run(
            [sys.executable, os.path.join(_ROOT, "make_perturb_with_fliptypes.py"), f"--INPUT_JSONL={base}"],
            check=True,
            capture_output=True,
        )
        jsonl = common.default_output(base, "_with_fliptypes.jsonl")
        records = common.load_records(jsonl, ("diff_caps", "diff_caps_*"))
        flips = explain.all_flips(records)
        drawn = sorted(random.Random(0).sample(range(len(flips)), min(N_FLIPS, len(flips))))
        cfg = {
            "JSONL_PATH": jsonl,
            "IMAGE_ROOT": work,
            "TEMPLATE": "",
            "LAYERS": 3,
            "TEXT_BATCH_SIZE": 32,
            "IMAGE_BATCH_SIZE": 64,
            "NUM_WORKERS": 0,
            "BOOTSTRAP": 1000,
            "BOOTSTRAP_SEED": 0,
        }
        enc = common.load_model(MODEL, "corrected", DEVICE, "fp32")
        from lgip.attribution import text_tower

        tower = text_tower(enc.model)
        embs, _, _ = common.encode_record_images(
            enc, records, work, 64, 0, indices=sorted({flips[j][0] for j in drawn})
        )
        only_flips = list(dict.fromkeys((flips[j][0], flips[j][2]) for j in drawn))
        with_captions = list(
            dict.fromkeys(
                key
                for j in drawn
                for k, i, f, _ in [flips[j]]
                for key in ((k, records[k][1]["orig_captions"][i]), (k, f))
            )
        )
        best = {"flips": float("inf"), "flips and captions": float("inf")}
        for _ in range(REPEATS):
            for name, keys in (("flips", only_flips), ("flips and captions", with_captions)):
                t0 = time.perf_counter()
                explain.attribute_texts(enc, tower, keys, embs, cfg)
                best[name] = min(best[name], time.perf_counter() - t0)
        print(f"{MODEL['name']} on {enc.device}: {len(drawn)} flips of {len(records)} records")
        for name, keys in (("flips", only_flips), ("flips and captions", with_captions)):
            print(f"  {name:20s} {len(keys):6d} texts attributed (one backward pass each)  {best[name]:7.2f} s")
        print(
            f"  captions add {len(with_captions) - len(only_flips)} texts: "
            f"x{best['flips and captions'] / best['flips']:.2f} "
            f"the flips' attribution time"
        )
        lines, _, _ = explain.explain(enc, tower, records, flips, {j: ["random"] for j in drawn}, cfg)
        t0 = time.perf_counter()
        block = explain.detection(lines, cfg)
        print(
            f"  detection figures over {len(lines)} lines ({cfg['BOOTSTRAP']} resamples): "
            f"{time.perf_counter() - t0:.2f} s; {explain.detection_line(block)}"
        )


if __name__ == "__main__":
    common.run_main(main)
