"""diff_gen_caption: add paraphrases (`same_caps`) and flips (`diff_caps`) to each caption.

LGIP_SPEC.md section 3. Reads the base JSONL; writes `<stem>_with_perturb.jsonl` next to
it, byte-identical to the published script's output.
  python diff_gen_caption.py --INPUT_JSONL=data/lgip_coco_native5_train2017.jsonl
"""

import os

import common

_HERE = os.path.dirname(os.path.abspath(__file__))
INPUT_JSONL = os.path.join(
    _HERE, "lgip_coco_native5_train2017.jsonl"
)  # base JSONL: one {image_path, orig_captions, ...} per line
OUTPUT_JSONL = None  # output path; None = <input stem>_with_perturb.jsonl next to the input
MAX_SAME_PER_CAP = 6  # int >= 0: paraphrases kept per caption (random.sample when there are more)
MAX_DIFF_PER_CAP = 6  # int >= 0: flips kept per caption (random.sample when there are more)
SEED = 42  # int: seed of the single random stream (42 reproduces the published outputs)
VERBOSE = True  # True: every line (paths written, comparisons, notes); False: the result lines (run_all's default)
CONFIG = common.configure(globals())


def perturb(rec, rng, stats):
    same, diff = {}, {}
    for i, c in enumerate(rec["orig_captions"]):
        # Published RNG order: the flips' choice() calls come before the paraphrases' sample().
        flips = [(t, ft) for t, ft in common.typed_flips(c, rng) if t.strip() != c.strip()]
        paras = [p for p in common.simple_paraphrases(c) if p.strip() != c.strip()]
        paras = common.cap_sample(paras, MAX_SAME_PER_CAP, rng)
        flips = common.cap_sample(flips, MAX_DIFF_PER_CAP, rng)
        same[str(i)] = paras
        diff[str(i)] = [t for t, _ in flips]
        stats["paraphrases"] += len(paras)
        for _, ft in flips:
            stats["flips_" + ft] += 1
    return {"same_caps": same, "diff_caps": diff}


def main():
    output = OUTPUT_JSONL or common.default_output(INPUT_JSONL, "_with_perturb.jsonl")
    common.run_generator(__file__, CONFIG, INPUT_JSONL, output, perturb)
    return output


def run(**constants):
    """The command line's run, and a call from Python: the constants as keyword arguments (lgip.entry);
    returns the output's path."""
    with common.script_call(globals(), constants):
        return main()


if __name__ == "__main__":
    common.run_main(run)
