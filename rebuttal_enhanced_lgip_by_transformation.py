"""rebuttal_enhanced_lgip_by_transformation: strength-aware sensitivity and paraphrase-kind analysis.

LGIP_SPEC.md section 4. Reads `rebuttal_enhanced_<stem>_with_fliptypes.jsonl` and writes all
models' results to `<that stem>__ENHANCED_LGIP_analysis.json` next to it.

The published fields keep the published computation (so numbers stay comparable), defects
included: `num_samples` counts batches of 32 records, and every flip enters the global figures
twice (once as "all", once typed). Corrected figures sit beside them under `corrected`: the
true record count, each flip counted once, and `combined_caps` (paraphrase + flip) evaluated.
  python rebuttal_enhanced_lgip_by_transformation.py --JSONL_PATH=rebuttal_enhanced_lgip_coco_native5_train2017_with_fliptypes.jsonl
"""
import os

import numpy as np

import common

_HERE = os.path.dirname(os.path.abspath(__file__))
JSONL_PATH = os.path.join(_HERE, "rebuttal_enhanced_lgip_coco_native5_train2017_with_fliptypes.jsonl")  # input: the enhanced generator's output
IMAGE_ROOT = None  # folder that image_path is relative to; None = the JSONL's folder
MODELS = common.PUBLISHED_MODELS  # list of specs {"name", "type": "openclip"|"siglip", "model_name"+"pretrained" | "model_id"}
PROTOCOL = "corrected"  # "corrected" (texts encoded as each model was trained) or "reference" (as the published code)
DEVICE = "auto"  # "auto" (cuda if available), "cpu", "cuda", "cuda:1", ...
DTYPE = "auto"  # "auto" (bf16 on CUDA, fp32 on CPU), "fp32", "bf16", "fp16"
IMAGE_BATCH_SIZE = 64  # int: images per forward pass
TEXT_BATCH_SIZE = 512  # int: texts per forward pass
NUM_WORKERS = None  # int: image-decoding worker processes; None = from the CPU count
CONFIG = common.configure(globals())

SIMPLE_MARKERS = ["a photo of", "an image of", "a picture of", "in this image", "in the picture", "this image shows"]
PRIORS = {"color": 0.25, "number": 0.55, "object": 1.0, "spatial": 0.80, "all": 0.60}
PUBLISHED_BATCH = 32  # the published script's record batch; its num_samples counts these


def strength(ftype, text_cos):
    d = np.clip(1.0 - text_cos, 0.0, 1.0)
    prior = np.array([PRIORS.get(t, PRIORS["all"]) for t in ftype])
    return np.clip(0.5 * prior + 0.5 * d, 0.0, 1.0)


def block(gaps, weights):
    """count, gap_mean, gap_std (n-1), pos_rate and their strength-weighted versions."""
    n = len(gaps)
    if n == 0:
        return {k: (0 if k == "count" else None) for k in
                ("count", "gap_mean", "gap_std", "pos_rate", "w_gap_mean", "w_pos_rate")}
    return {"count": n, "gap_mean": float(gaps.mean()), "gap_std": float(gaps.std(ddof=1)) if n > 1 else 0.0,
            "pos_rate": float((gaps > 0).mean()), "w_gap_mean": float((gaps * weights).sum() / weights.sum()),
            "w_pos_rate": float(weights[gaps > 0].sum() / weights.sum())}


def strength_analysis(types, gaps, s):
    """Global figures plus per-type weak/medium/strong bins, as the published script computes them."""
    w = np.maximum(1e-4, s)
    q_low, q_high = (float(q) for q in np.quantile(s, [0.25, 0.75])) if len(s) else (None, None)
    bins = np.where(s <= q_low, "weak", np.where(s <= q_high, "medium", "strong")) if len(s) else s
    stats = {}
    for t in dict.fromkeys(types):  # types in order of first appearance
        m = types == t
        stats[t] = {"overall": block(gaps[m], w[m])}
        for b in ("weak", "medium", "strong"):
            stats[t][b] = block(gaps[m & (bins == b)], w[m & (bins == b)])
    full = block(gaps, w)
    return {
        "global_sensitivity": {k: full[k] for k in ("count", "gap_mean", "gap_std", "pos_rate")},
        "global_strength": {"count": len(s), "strength_mean": common.mean_or_none(s), "q_low": q_low, "q_high": q_high},
        "global_weighted_sensitivity": {k: full[k] for k in ("count", "w_gap_mean", "w_pos_rate")},
        "error_type_stats": stats,
    }


def evaluate(enc, records, image_root):
    img_emb, ok, image_report = common.encode_record_images(enc, records, image_root, IMAGE_BATCH_SIZE, NUM_WORKERS)
    bank = common.TextBank(enc)
    para, flips, combined = ([], [], [], []), ([], [], [], []), ([], [], [], [])  # (record, caption slot, slot, label)
    for k in ok:
        rec = records[k][1]
        orig = bank.add_call(rec["orig_captions"])
        flip_fields = ["diff_caps"] + [f for f in rec if f.startswith("diff_caps_")]
        for i in range(len(rec["orig_captions"])):
            texts = common.caption_texts(rec, "same_caps", i)
            simple = [p for p in texts if any(m in p.lower() for m in SIMPLE_MARKERS)]
            advanced = [p for p in texts if not any(m in p.lower() for m in SIMPLE_MARKERS)]
            # published calls: simple and advanced paraphrases apart, then each flip list
            groups = [(para, bank.add_call(simple), ["simple"] * len(simple)),
                      (para, bank.add_call(advanced), ["advanced"] * len(advanced))]
            for f in flip_fields:  # "all" first, then each typed list
                texts = common.caption_texts(rec, f, i)
                groups.append((flips, bank.add_call(texts), [f[len("diff_caps_"):] or "all"] * len(texts)))
            items = rec.get("combined_caps", {}).get(str(i), [])
            groups.append((combined, bank.add_call([c["text"] for c in items]), [c["combined_type"] for c in items]))
            for target, slots, labels in groups:
                for s, label in zip(slots, labels):
                    target[0].append(k), target[1].append(orig[i]), target[2].append(s), target[3].append(label)
    txt_emb, rows = bank.encode(TEXT_BATCH_SIZE)

    def scored(p):
        base = common.cosines(img_emb, txt_emb, p[0], rows[p[1]])
        other = common.cosines(img_emb, txt_emb, p[0], rows[p[2]])
        text_cos = common.cosines(txt_emb, txt_emb, rows[p[1]], rows[p[2]])
        return base - other, text_cos, np.array(p[3], dtype=object)

    inv_diff, _, kinds = scored(para)
    inv = np.abs(inv_diff)
    gaps, text_cos, types = scored(flips)
    s = strength(types, text_cos)
    m = {"model_tag": enc.name,
         "num_samples": -(-len(ok) // PUBLISHED_BATCH),  # published: batches of 32 records (see corrected)
         "global_invariance_error_mean": common.mean_or_none(inv),
         "paraphrase_simple_inv_error_mean": common.mean_or_none(inv[kinds == "simple"]),
         "paraphrase_advanced_inv_error_mean": common.mean_or_none(inv[kinds == "advanced"]),
         "paraphrase_simple_count": int((kinds == "simple").sum()),
         "paraphrase_advanced_count": int((kinds == "advanced").sum())}
    m.update(strength_analysis(types, gaps, s))
    once = types != "all"  # every flip of diff_caps also sits in exactly one typed list
    c_gaps, c_cos, c_types = scored(combined)
    c_prior_types = np.array([t.split("+", 1)[-1] for t in c_types], dtype=object)
    m["corrected"] = {"num_records": len(ok), **strength_analysis(types[once], gaps[once], s[once]),
                      "combined": strength_analysis(c_types, c_gaps, strength(c_prior_types, c_cos))}
    m["run"] = common.eval_run_info(__file__, CONFIG, enc, image_report, len(records), bank)
    return m


def main():
    records = common.load_records(JSONL_PATH, per_caption_fields=("same_caps", "diff_caps"))
    image_root = IMAGE_ROOT or os.path.dirname(os.path.abspath(JSONL_PATH))
    results = []
    for spec in MODELS:
        enc = common.load_model(spec, PROTOCOL, DEVICE, DTYPE)
        m = evaluate(enc, records, image_root)
        c = m["corrected"]
        print(f"{enc.name}: invariance error {m['global_invariance_error_mean']:.4f} "
              f"(simple {m['paraphrase_simple_inv_error_mean'] or 0:.4f}, advanced {m['paraphrase_advanced_inv_error_mean'] or 0:.4f}); "
              f"flips once: gap {c['global_sensitivity']['gap_mean'] or 0:.4f}, positive rate {c['global_sensitivity']['pos_rate'] or 0:.3f}; "
              f"combined positive rate {c['combined']['global_sensitivity']['pos_rate'] or 0:.3f}")
        results.append(m)
    out = common.metrics_path(JSONL_PATH, "ENHANCED_LGIP_analysis.json")
    common.write_json(out, results)
    print(f"-> {out}")


if __name__ == "__main__":
    common.run_main(main)
