"""bench_blind: blind_audit.py's time on a synthetic input of COCO's shape (N_RECORDS records of five captions of
7-12 words, each caption with two number flips and three color and three object flips), each scorer timed apart
(lgip.blind's functions, as blind_audit.py calls them) and the whole script once, with its intervals.

Prints the records, pairs, each scorer's seconds and pairs per second, and the script's total.
  python benchmarks/bench_blind.py                         # 8,000 records (320,000 pairs)
  python benchmarks/bench_blind.py --N_RECORDS=40000       # the paper's images
"""

import json
import os
import random
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.abspath(os.path.dirname(__file__)))
sys.path.insert(1, _ROOT)
import common  # noqa: E402

N_RECORDS = 8000  # int >= 10: synthetic records
SCORERS = ["length", "ngram1", "ngram3", "edit"]  # blind_audit.py scorers timed
BOOTSTRAP = 1000  # int >= 0: the script's resamples
SEED = 0  # int: the synthetic captions
CONFIG = common.configure(globals())

WORDS = (
    "a the man woman dog cat red blue green two three on in near with street table car bus plate food sitting "
    "standing large small white black"
).split()


def write_records(path, n, seed):
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for r in range(n):
            caps = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(7, 12))) for _ in range(5)]
            color = {
                str(i): [c.replace(c.split()[0], w, 1) for w in ("purple", "pink", "gray")] for i, c in enumerate(caps)
            }
            number = {str(i): ["two " + c, "four " + c] for i, c in enumerate(caps)}
            obj = {
                str(i): [c.replace(c.split()[-1], w) for w in ("giraffe", "kite", "boat")] for i, c in enumerate(caps)
            }
            both = {k: color[k] + number[k] + obj[k] for k in color}
            rec = {"image_id": r, "image_path": f"i/{r}.jpg", "orig_captions": caps, "diff_caps": both}
            rec.update(diff_caps_color=color, diff_caps_number=number, diff_caps_object=obj)
            f.write(json.dumps(rec) + "\n")


def main():
    from lgip import blind

    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "synthetic_with_fliptypes.jsonl")
        write_records(path, N_RECORDS, SEED)
        records = common.load_records(path, ("diff_caps", "diff_caps_*"))
        pairs, types = blind.blind_pairs(records)
        folds = [blind.fold_of(rec, 5) for _, rec in records]
        print(f"{len(records):,} records, {len(pairs):,} pairs, types {', '.join(types)}")
        corpora = blind.fold_corpora(records, folds, 5)
        from lgip import accelerations

        for name in SCORERS:
            for memo in (False, True) if name.startswith("ngram") else (True,):
                accelerations.NGRAM_MEMO = memo  # (side by side: the plain path, then the acceleration)
                t0 = time.perf_counter()
                if name == "length":
                    blind.length_gaps(pairs)
                elif name == "edit":
                    blind.edit_gaps(pairs, folds, 5)
                else:
                    blind.ngram_gaps(pairs, corpora, folds, int(name[5:]))
                s = time.perf_counter() - t0
                what = f"{name} (NGRAM_MEMO {memo})" if name.startswith("ngram") else name
                print(f"  {what:26s} {s:7.2f} s  {len(pairs) / s:12,.0f} pairs/s")
        import blind_audit

        t0 = time.perf_counter()
        blind_audit.run(JSONL_PATH=path, SCORERS=SCORERS, BOOTSTRAP=BOOTSTRAP, VERBOSE=False)
        print(f"blind_audit.py in all (figures, {BOOTSTRAP} resamples, files): {time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
