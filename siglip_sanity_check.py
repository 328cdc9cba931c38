"""siglip_sanity_check: does SigLIP score a caption above its flips? Shown under both protocols.

LGIP_SPEC.md section 4. Picks N_RECORDS random records that have a flip, one random caption with
flips from each and up to MAX_FLIPS of its flips, and prints sim(image, caption), sim(image, flip)
and their difference, encoded as the model was trained (corrected: text padded to 64) beside the
published encoding (reference: each call padded to its longest text). Also writes the table to
`<stem>__siglip_sanity.json` next to the input.
  python siglip_sanity_check.py --JSONL_PATH=lgip_coco_native5_train2017_with_fliptypes.jsonl
"""
import os
import random

import common

_HERE = os.path.dirname(os.path.abspath(__file__))
JSONL_PATH = os.path.join(_HERE, "lgip_coco_native5_train2017_with_fliptypes.jsonl")  # any JSONL with diff_caps
IMAGE_ROOT = None  # folder that image_path is relative to; None = the JSONL's folder
MODEL = {"name": "siglip_google_siglip-base-patch16-224", "type": "siglip", "model_id": "google/siglip-base-patch16-224"}  # one model spec
N_RECORDS = 10  # int: records drawn (among those with at least one flip)
MAX_FLIPS = 5  # int: flips shown per caption
SEED = 0  # int: seeds which records and captions are drawn
DEVICE = "auto"  # "auto" (cuda if available), "cpu", "cuda", ...
DTYPE = "fp32"  # "fp32", "bf16", "fp16", "auto"
CONFIG = common.configure(globals())


def draw(records, rng):
    """[(line, record, caption index)] for up to N_RECORDS records with flips."""
    with_flips = [(n, r) for n, r in records if any(r["diff_caps"].get(str(i)) for i in range(len(r["orig_captions"])))]
    picked = rng.sample(with_flips, min(N_RECORDS, len(with_flips)))
    out = []
    for n, r in picked:
        i = rng.choice([i for i in range(len(r["orig_captions"])) if r["diff_caps"].get(str(i))])
        out.append((n, r, i))
    return out


def similarities(enc, picks, image_root):
    """Per pick: (sim(image, caption), [sim(image, flip)]); caption and flips form one text call."""
    img, ok, report = common.encode_record_images(enc, [(n, r) for n, r, _ in picks], image_root, 16, 0)
    bank = common.TextBank(enc)
    calls = [bank.add_call([r["orig_captions"][i]] + r["diff_caps"][str(i)][:MAX_FLIPS]) for _, r, i in picks]
    txt, rows = bank.encode(256)
    out = []
    for k, slots in enumerate(calls):
        if k not in ok:
            out.append(None)
            continue
        sims = common.cosines(img, txt, [k] * len(slots), rows[slots])
        out.append((float(sims[0]), [float(s) for s in sims[1:]]))
    return out, report


def main():
    records = common.load_records(JSONL_PATH, per_caption_fields=("diff_caps",))
    image_root = IMAGE_ROOT or os.path.dirname(os.path.abspath(JSONL_PATH))
    picks = draw(records, random.Random(SEED))
    results = {p: similarities(common.load_model(MODEL, p, DEVICE, DTYPE), picks, image_root) for p in common.PROTOCOLS}
    rows = []
    print(f"{MODEL['name']}: similarity to the image, corrected (as trained) | reference (published encoding)")
    print(f"{'text':<60} {'corr':>7} {'delta':>7} | {'ref':>7} {'delta':>7}")
    for k, (line, rec, i) in enumerate(picks):
        corr, ref = results["corrected"][0][k], results["reference"][0][k]
        print(f"-- line {line}: {rec['image_path']}")
        if corr is None:
            print("   (image unreadable: skipped)")
            continue
        texts = [rec["orig_captions"][i]] + rec["diff_caps"][str(i)][:MAX_FLIPS]
        for j, text in enumerate(texts):
            c = corr[0] if j == 0 else corr[1][j - 1]
            r = ref[0] if j == 0 else ref[1][j - 1]
            dc, dr = ("", "") if j == 0 else (f"{c - corr[0]:+.4f}", f"{r - ref[0]:+.4f}")
            label = text if j == 0 else "  flip: " + text
            print(f"{label[:60]:<60} {c:7.4f} {dc:>7} | {r:7.4f} {dr:>7}")
            rows.append({"line": line, "image_path": rec["image_path"], "caption_index": i, "text": text,
                         "is_flip": j > 0, "sim_corrected": c, "sim_reference": r})
    flips = [r for r in rows if r["is_flip"]]
    for p in common.PROTOCOLS:
        base = {(r["line"], r["caption_index"]): r[f"sim_{p}"] for r in rows if not r["is_flip"]}
        below = sum(r[f"sim_{p}"] < base[(r["line"], r["caption_index"])] for r in flips)
        print(f"{p}: {below}/{len(flips)} flips score below their caption")
    out = common.metrics_path(JSONL_PATH, "siglip_sanity.json")
    common.write_json(out, {"rows": rows, "run": common.provenance(__file__, CONFIG),
                            "image_report": results["corrected"][1]})
    print(f"-> {out}")


if __name__ == "__main__":
    common.run_main(main)
