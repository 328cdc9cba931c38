"""rebuttal_enhanced_perturb_with_fliptypes: advanced paraphrases, typed flips, paraphrase+flip combinations.

LGIP_SPEC.md section 3. Reads the base JSONL; writes `rebuttal_enhanced_<stem>_with_fliptypes.jsonl`
next to it with `same_caps`, `diff_caps`, `diff_caps_{color,number,object}` and `combined_caps`.

Paraphrase order: the published script de-duplicates paraphrase candidates through a Python
set, so which 6 paraphrases `random.sample` keeps (and which 5 seed `combined_caps`) changes
with PYTHONHASHSEED. Here the candidates keep their generation order (templates, prefixes,
passive rewrites, single then double synonym swaps; first occurrence wins), so the output is
the same on every run, drawn from exactly the published candidate pool.
  python rebuttal_enhanced_perturb_with_fliptypes.py --INPUT_JSONL=data/lgip_coco_native5_train2017.jsonl
"""

import os

import common

_HERE = os.path.dirname(os.path.abspath(__file__))
INPUT_JSONL = os.path.join(
    _HERE, "lgip_coco_native5_train2017.jsonl"
)  # base JSONL: one {image_path, orig_captions, ...} per line
OUTPUT_JSONL = None  # output path; None = rebuttal_enhanced_<input stem>_with_fliptypes.jsonl next to the input
MAX_SAME_PER_CAP = 6  # int >= 0: paraphrases kept per caption (random.sample when there are more)
MAX_DIFF_PER_CAP = 6  # int >= 0: flips kept per caption (random.sample when there are more)
MAX_COMBINED_PER_CAP = 6  # int >= 0: paraphrase+flip texts kept per caption (the first ones)
COMBINED_SOURCE_PARAS = 5  # int >= 0: how many paraphrases (in order) are flipped for combined_caps
MAX_CAPTION_WORDS = 100  # int >= 1: a record with a longer caption is skipped, counted and reported (its double synonym
#   swaps grow with the square of its length: 400 words took 0.86 GB); COCO captions have at most ~50
PARAPHRASE_ORDER = (
    "generation"  # "generation" (deterministic) or "set" (the published order; depends on PYTHONHASHSEED)
)
SEED = 42  # int: seed of the single random stream (42 reproduces the published outputs)
VERBOSE = True  # True: every line (paths written, comparisons, notes); False: the result lines (run_all's default)
CONFIG = common.configure(globals())


def check_length(rec):
    """SkipRecord when a caption has more than MAX_CAPTION_WORDS words: checked before any
    random call, so the records after it get what they would get without it."""
    for i, c in enumerate(rec["orig_captions"]):
        if len(c.split()) > MAX_CAPTION_WORDS:
            raise common.SkipRecord(
                "caption_over_MAX_CAPTION_WORDS",
                f"field 'orig_captions[{i}]' has {len(c.split()):,} words, over MAX_CAPTION_WORDS={MAX_CAPTION_WORDS}",
            )


def perturb(rec, rng, stats):
    check_length(rec)
    fields = {"same_caps": {}, "diff_caps": {}}
    fields.update({"diff_caps_" + t: {} for t in common.FLIP_TYPES})
    fields["combined_caps"] = {}
    for i, c in enumerate(rec["orig_captions"]):
        key = str(i)
        # RNG order per caption (published): paraphrase sample, flip choices, combined flip choices.
        paras = common.advanced_paraphrases(c, PARAPHRASE_ORDER)
        same = [p for p in paras if p.strip() != c.strip()]
        fields["same_caps"][key] = common.cap_sample(same, MAX_SAME_PER_CAP, rng)
        common.add_typed_flips(fields, key, c, rng, MAX_DIFF_PER_CAP, stats)
        combined = []
        # The published script recomputes the paraphrase list here: the same list, so reuse it.
        for p in paras[:COMBINED_SOURCE_PARAS]:
            for text, ftype in common.typed_flips(p, rng):
                combined.append({"text": text, "combined_type": "para+" + ftype, "intermediate_para": p})
        fields["combined_caps"][key] = combined[:MAX_COMBINED_PER_CAP]
        stats["paraphrases"] += len(fields["same_caps"][key])
        stats["combined"] += len(fields["combined_caps"][key])
    return fields


def main():
    if PARAPHRASE_ORDER not in ("generation", "set"):  # (the counts and SEED: lgip.settings, checked by run_main)
        raise common.ConfigError(f'PARAPHRASE_ORDER must be "generation" or "set", got {PARAPHRASE_ORDER!r}')
    common.require_int(CONFIG, "MAX_CAPTION_WORDS", 1)
    output = OUTPUT_JSONL or common.default_output(INPUT_JSONL, "_with_fliptypes.jsonl", "rebuttal_enhanced_")
    common.run_generator(__file__, CONFIG, INPUT_JSONL, output, perturb)
    return output


def run(**constants):
    """The command line's run, and a call from Python: the constants as keyword arguments (lgip.entry);
    returns the output's path."""
    with common.script_call(globals(), constants):
        return main()


if __name__ == "__main__":
    common.run_main(run)
