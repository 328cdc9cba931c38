"""siglip_sanity_check: does SigLIP score a caption above its flips? Shown under both protocols.

LGIP_SPEC.md section 4. Draws as the published script does, in its order of random calls (seed
42): the records with at least one flip are shuffled and the first N_RECORDS taken; for each whose
image reads, one caption with flips is chosen, and MAX_FLIPS of its flips sampled when it has more.
So with the same seed and JSONL it shows the published printout's records, captions and flips.
It prints sim(image, caption), sim(image, flip) and their difference, encoded as the model was
trained (corrected: text padded to 64) beside the published encoding (reference: caption and
flips in one call, padded to its longest text). Also writes the table to
`<stem>__siglip_sanity.json` next to the input.
  python siglip_sanity_check.py --JSONL_PATH=lgip_coco_native5_train2017_with_perturb.jsonl
"""

import os
import random

import common

_HERE = os.path.dirname(os.path.abspath(__file__))
JSONL_PATH = os.path.join(_HERE, "lgip_coco_native5_train2017_with_perturb.jsonl")  # any JSONL with diff_caps
#   (published default: the diff_gen_caption output)
IMAGE_ROOT = None  # folder that image_path is relative to; None = the JSONL's folder
MODEL = {  # one model spec
    "name": "siglip_google_siglip-base-patch16-224",
    "type": "siglip",
    "model_id": "google/siglip-base-patch16-224",
}
N_RECORDS = 10  # int >= 1: records drawn (among those with at least one flip); published: 10
MAX_FLIPS = 5  # int >= 1: flips shown per caption (sampled when a caption has more); published: 5
SEED = 42  # int: seed of the draws (one random.Random, in the published order of calls); published: 42
DEVICE = "auto"  # "auto" (cuda if available), "cpu", "cuda", ...
DTYPE = "fp32"  # "fp32", "bf16", "fp16", "auto"
VERBOSE = True  # True: every line (paths written, comparisons, notes); False: the result lines (run_all's default)
CONFIG = common.configure(globals())


def select(records, rng):
    """The published selection: records with a non-empty flip list, shuffled, the first N_RECORDS."""
    valid = [(n, r) for n, r in records if any(len(v) > 0 for v in r["diff_caps"].values())]
    rng.shuffle(valid)
    return valid[:N_RECORDS]


def draw(selected, readable, rng):
    """Per selected record: (caption index, flips), or None when its image fails (then, as published,
    no random call is made). A selected record has a caption with flips: its keys are caption indices."""
    picks = []
    for k, (_, r) in enumerate(selected):
        if k not in readable:
            picks.append(None)
            continue
        i = rng.choice([i for i in range(len(r["orig_captions"])) if r["diff_caps"].get(str(i))])
        flips = r["diff_caps"][str(i)]
        picks.append((i, rng.sample(flips, MAX_FLIPS) if len(flips) > MAX_FLIPS else list(flips)))
    return picks


def similarities(enc, img, selected, picks):
    """Per pick: (sim(image, caption), [sim(image, flip)]); caption and flips form one text call."""
    bank = common.TextBank(enc)
    calls = [bank.add_call([r["orig_captions"][p[0]]] + p[1]) if p else None for (_, r), p in zip(selected, picks)]
    txt, rows = bank.encode(256)
    out = []
    for k, slots in enumerate(calls):
        if slots is None:
            out.append(None)
            continue
        sims = common.cosines(img, txt, [k] * len(slots), rows[slots])
        out.append((float(sims[0]), [float(s) for s in sims[1:]]))
    return out


def main():
    for name in ("N_RECORDS", "MAX_FLIPS"):  # (the shared settings: lgip.settings, checked by run_main)
        common.require_int(CONFIG, name, 1)
    records = common.load_records(JSONL_PATH, per_caption_fields=("diff_caps",))
    image_root = IMAGE_ROOT or os.path.dirname(os.path.abspath(JSONL_PATH))
    rng = random.Random(SEED)
    selected = select(records, rng)
    if not selected:  # (before any model is loaded)
        raise common.InputError(f"no record with a flip (diff_caps) in {JSONL_PATH}: nothing to check; nothing written")
    encoders = {p: common.load_model(MODEL, p, DEVICE, DTYPE) for p in common.PROTOCOLS}
    # images encoded by each protocol's model (an open_clip model trained with QuickGELU is built with it
    # only when corrected, both towers), before the draws that depend on which images read
    imgs = {p: common.encode_record_images(enc, selected, image_root, 16, 0) for p, enc in encoders.items()}
    _, readable, report = imgs["corrected"]
    if not readable:
        first = (report.get("failed_images") or [{}])[0]
        raise common.InputError(
            f"none of the {len(selected)} drawn records' images could be read (IMAGE_ROOT "
            f"{image_root}; first: {first.get('path')}: {first.get('error')}); nothing written"
        )
    picks = draw(selected, set(readable), rng)
    results = {p: similarities(enc, imgs[p][0], selected, picks) for p, enc in encoders.items()}
    rows = []
    print(f"{MODEL['name']}: similarity to the image, corrected (as trained) | reference (published encoding)")
    print(f"{'text':<60} {'corr':>7} {'delta':>7} | {'ref':>7} {'delta':>7}")
    for k, ((line, rec), pick) in enumerate(zip(selected, picks)):
        print(f"-- line {line}: {rec['image_path']}")
        if pick is None:
            print("   (image unreadable: skipped)")
            continue
        (i, flips), corr, ref = pick, results["corrected"][k], results["reference"][k]
        for j, text in enumerate([rec["orig_captions"][i]] + flips):
            c = corr[0] if j == 0 else corr[1][j - 1]
            r = ref[0] if j == 0 else ref[1][j - 1]
            dc, dr = ("", "") if j == 0 else (f"{c - corr[0]:+.4f}", f"{r - ref[0]:+.4f}")
            label = text if j == 0 else "  flip: " + text
            print(f"{label[:60]:<60} {c:7.4f} {dc:>7} | {r:7.4f} {dr:>7}")
            rows.append(
                {
                    "line": line,
                    "image_path": rec["image_path"],
                    "caption_index": i,
                    "text": text,
                    "is_flip": j > 0,
                    "sim_corrected": c,
                    "sim_reference": r,
                }
            )
    flips = [r for r in rows if r["is_flip"]]
    for p in common.PROTOCOLS:
        base = {(r["line"], r["caption_index"]): r[f"sim_{p}"] for r in rows if not r["is_flip"]}
        below = sum(r[f"sim_{p}"] < base[(r["line"], r["caption_index"])] for r in flips)
        print(f"{p}: {below}/{len(flips)} flips score below their caption")
    out = common.metrics_path(JSONL_PATH, "siglip_sanity.json")
    common.write_json(out, {"rows": rows, "run": common.provenance(__file__, CONFIG), "image_report": report})
    print(f"-> {out}")
    return out


def run(**constants):
    """The command line's run, and a call from Python: the constants as keyword arguments (lgip.entry);
    returns the output's path."""
    with common.script_call(globals(), constants):
        return main()


if __name__ == "__main__":
    common.run_main(run)
