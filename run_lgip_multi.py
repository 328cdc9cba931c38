"""run_lgip_multi: invariance error and sensitivity gap of each model on a perturbed JSONL.

LGIP_SPEC.md section 4. Reads `<stem>_with_perturb.jsonl` (from diff_gen_caption.py); for each
model writes `<stem>__LGIP_<model>.metrics.json` next to it, and all models together to
`<stem>__LGIP_ALL.metrics.json`.
  python run_lgip_multi.py --JSONL_PATH=lgip_coco_native5_train2017_with_perturb.jsonl --PROTOCOL=reference
"""
import os

import common

_HERE = os.path.dirname(os.path.abspath(__file__))
JSONL_PATH = os.path.join(_HERE, "lgip_coco_native5_train2017_with_perturb.jsonl")  # input: diff_gen_caption.py output
IMAGE_ROOT = None  # folder that image_path is relative to; None = the JSONL's folder
MODELS = common.PUBLISHED_MODELS  # list of specs {"name", "type": "openclip"|"siglip", "model_name"+"pretrained" | "model_id"}
PROTOCOL = "corrected"  # "corrected" (texts encoded as each model was trained) or "reference" (as the published code)
DEVICE = "auto"  # "auto" (cuda if available), "cpu", "cuda", "cuda:1", ...
DTYPE = "auto"  # "auto" (bf16 on CUDA, fp32 on CPU), "fp32", "bf16", "fp16"
IMAGE_BATCH_SIZE = 64  # int: images per forward pass
TEXT_BATCH_SIZE = 512  # int: texts per forward pass
NUM_WORKERS = None  # int: image-decoding worker processes; None = from the CPU count
CONFIG = common.configure(globals())


def evaluate(enc, records, image_root):
    img_emb, ok, image_report = common.encode_record_images(enc, records, image_root, IMAGE_BATCH_SIZE, NUM_WORKERS)
    bank = common.TextBank(enc)
    inv, sens = ([], [], []), ([], [], [])  # (record index, caption slot, other slot)
    for k in ok:
        rec = records[k][1]
        orig = bank.add_call(rec["orig_captions"])  # the published calls: 5 originals, then per caption
        for i in range(len(rec["orig_captions"])):
            for slots, pairs in ((bank.add_call(common.caption_texts(rec, "same_caps", i)), inv),
                                 (bank.add_call(common.caption_texts(rec, "diff_caps", i)), sens)):
                for s in slots:
                    pairs[0].append(k), pairs[1].append(orig[i]), pairs[2].append(s)
    txt_emb, rows = bank.encode(TEXT_BATCH_SIZE)

    def sims(pairs):
        base = common.cosines(img_emb, txt_emb, pairs[0], rows[pairs[1]])
        other = common.cosines(img_emb, txt_emb, pairs[0], rows[pairs[2]])
        return base, other

    b_inv, o_inv = sims(inv)
    b_sens, o_sens = sims(sens)
    gaps = b_sens - o_sens
    metrics = {
        "model_tag": enc.name,
        "num_samples": len(ok),
        "num_invariance_pairs": len(inv[0]),
        "num_sensitivity_pairs": len(sens[0]),
        "invariance_error_mean": common.mean_or_none(abs(b_inv - o_inv)),
        "sensitivity_gap_mean": common.mean_or_none(gaps),
        "sensitivity_pos_rate": common.mean_or_none(gaps > 0),
    }
    metrics["run"] = common.eval_run_info(__file__, CONFIG, enc, image_report, len(records), bank)
    return metrics


def main():
    records = common.load_records(JSONL_PATH, per_caption_fields=("same_caps", "diff_caps"))
    image_root = IMAGE_ROOT or os.path.dirname(os.path.abspath(JSONL_PATH))
    results = []
    for spec in MODELS:
        enc = common.load_model(spec, PROTOCOL, DEVICE, DTYPE)
        metrics = evaluate(enc, records, image_root)
        common.write_json(common.metrics_path(JSONL_PATH, f"LGIP_{enc.name}.metrics.json"), metrics)
        print(f"{enc.name}: invariance error {metrics['invariance_error_mean']:.4f}, "
              f"gap {metrics['sensitivity_gap_mean']:.4f}, positive rate {metrics['sensitivity_pos_rate']:.3f} "
              f"({metrics['num_samples']} records, {metrics['run']['num_failed_images']} unreadable images)")
        results.append(metrics)
    out = common.metrics_path(JSONL_PATH, "LGIP_ALL.metrics.json")
    common.write_json(out, results)
    print(f"-> {out}")


if __name__ == "__main__":
    common.run_main(main)
