"""make_perturb_with_fliptypes: paraphrases plus flips split by type (color, number, object).

LGIP_SPEC.md section 3. Reads the base JSONL; writes `<stem>_with_fliptypes.jsonl` next to
it with `same_caps`, `diff_caps` and `diff_caps_{color,number,object}`, byte-identical to the
published script's output.
  python make_perturb_with_fliptypes.py --INPUT_JSONL=data/lgip_coco_native5_train2017.jsonl
"""

import os

import common

_HERE = os.path.dirname(os.path.abspath(__file__))
INPUT_JSONL = os.path.join(_HERE, "lgip_coco_native5_train2017.jsonl")  # base JSONL: one {image_path, orig_captions,
#   ...} per line
OUTPUT_JSONL = None  # output path; None = <input stem>_with_fliptypes.jsonl next to the input
MAX_SAME_PER_CAP = 6  # int >= 0: paraphrases kept per caption (random.sample when there are more)
MAX_DIFF_PER_CAP = 6  # int >= 0: flips kept per caption (random.sample when there are more)
SEED = 42  # int: seed of the single random stream (42 reproduces the published outputs)
VERBOSE = True  # True: every line (paths written, comparisons, notes); False: the result lines (run_all's default)
CONFIG = common.configure(globals())


def perturb(rec, rng, stats):
    fields = {"same_caps": {}, "diff_caps": {}}
    fields.update({"diff_caps_" + t: {} for t in common.FLIP_TYPES})
    for i, c in enumerate(rec["orig_captions"]):
        key = str(i)
        # Published RNG order here: paraphrases sampled first, then the flips' choice() calls.
        paras = [p for p in common.simple_paraphrases(c) if p.strip() != c.strip()]
        fields["same_caps"][key] = common.cap_sample(paras, MAX_SAME_PER_CAP, rng)
        common.add_typed_flips(fields, key, c, rng, MAX_DIFF_PER_CAP, stats)
        stats["paraphrases"] += len(fields["same_caps"][key])
    return fields


def main():
    output = OUTPUT_JSONL or common.default_output(INPUT_JSONL, "_with_fliptypes.jsonl")
    common.run_generator(__file__, CONFIG, INPUT_JSONL, output, perturb)
    return output


def run(**constants):
    """The command line's run, and a call from Python: the constants as keyword arguments (lgip.entry); returns the
    output's path."""
    with common.script_call(globals(), constants):
        return main()


if __name__ == "__main__":
    common.run_main(run)
