"""explain_flips: which word does a model blame for a flip? Word attribution (LGIP_SPEC.md section 8,
after CLIP4DM), and how often it finds the flipped word.

For each model of MODELS and a sample of the input's flips (N_FLIPS drawn with SEED, plus the
model's TOP_K most preferred flips when a score file of this input is beside it, from
run_lgip_by_fliptype.py), cos(image, flip) and cos(image, caption) are attributed to their tokens
through the gradients of the last LAYERS attention layers of the text tower, the tokens' scores
averaged per word, and the lowest-scoring word blamed. A flip changes one known word, so
`localization_acc` says how often the blamed word is the changed one (over the flips the model
catches, gap > 0, and over those it prefers). Texts are encoded as the corrected protocol does,
in fp32. Writes `<stem>__LGIP_explain_<model>.jsonl` (one line per flip) and
`<stem>__LGIP_explain.metrics.json` (one dict per model) next to the input.
  python explain_flips.py --JSONL_PATH=lgip_coco_native5_train2017_with_fliptypes.jsonl --N_FLIPS=500
"""
import os
import random

import numpy as np

import common

_HERE = os.path.dirname(os.path.abspath(__file__))
JSONL_PATH = os.path.join(_HERE, "lgip_coco_native5_train2017_with_fliptypes.jsonl")  # input: make_perturb_with_fliptypes.py output (any JSONL with diff_caps)
IMAGE_ROOT = None  # folder that image_path is relative to; None = the JSONL's folder
MODELS = common.PUBLISHED_MODELS  # list of specs (see run_lgip_multi.py); families: open_clip CLIP/OpenCLIP/EVA02, transformers CLIPModel, SigLIP, SigLIP2
DEVICE = "auto"  # "auto" (cuda if available), "cpu", "cuda", "cuda:1", ... (the models run in fp32)
N_FLIPS = 1000  # int >= 0: flips drawn at random (with SEED) from all the input's flips, the same for every model; None = all
SEED = 0  # int: seed of that draw
TOP_K = 50  # int >= 0: also each model's TOP_K most preferred flips (lowest caption - flip gap) in its score file of this input, when there is one
LAYERS = 3  # int >= 1: the last LAYERS attention layers of the text tower are averaged (all when it has fewer)
TEMPLATE = ""  # "" (texts as written, as LGIP scores them) or a prefix ending in a space, e.g. "A photo depicts " (CLIP4DM's); its tokens are never words
TEXT_BATCH_SIZE = 32  # int >= 1: texts per forward and backward pass
IMAGE_BATCH_SIZE = 64  # int >= 1: images per forward pass
NUM_WORKERS = None  # int >= 0 (0: decoded in the main process): image-decoding worker processes; None = from the CPU count
UNSUPPORTED = "stop"  # "stop": a model of a family word attribution does not support stops the script, naming the supported ones; "skip": it is left out with that message (listed in the metrics as "unsupported"; run_all.py's choice)
BOOTSTRAP = 1000  # int >= 0: bootstrap resamples of the flips for the *_ci95 fields; 0 = no intervals
BOOTSTRAP_SEED = 0  # int: seed of the bootstrap resampling
CONFIG = common.configure(globals())


def check_config(config):
    # (IMAGE_BATCH_SIZE, BOOTSTRAP and the other shared settings: lgip.settings; TEXT_BATCH_SIZE has no "auto" here)
    for name, low in (("N_FLIPS", 0), ("TOP_K", 0), ("LAYERS", 1), ("TEXT_BATCH_SIZE", 1)):
        common.require_int(config, name, low, none_ok=name == "N_FLIPS")
    if config["UNSUPPORTED"] not in ("stop", "skip"):
        raise common.ConfigError(f"UNSUPPORTED must be \"stop\" or \"skip\", got {config['UNSUPPORTED']!r}")
    if not isinstance(TEMPLATE, str) or (TEMPLATE and not TEMPLATE[-1].isspace()):
        raise common.ConfigError(f"TEMPLATE must be \"\" or a string ending in a space, got {TEMPLATE!r}")


def all_flips(records):
    """(record position, caption index, flip, flip type) of every flip in file order: the typed
    lists when the records have them, else diff_caps typed by the word lists ("other" if none)."""
    flips = []
    for k, (_, rec) in enumerate(records):
        typed = [f[len("diff_caps_"):] for f in rec if f.startswith("diff_caps_")]
        for i, caption in enumerate(rec["orig_captions"]):
            if typed:
                flips += [(k, i, f, t) for t in typed for f in common.caption_texts(rec, "diff_caps_" + t, i)]
            else:
                flips += [(k, i, f, common.infer_flip_type(caption, f) or "other")
                          for f in common.caption_texts(rec, "diff_caps", i)]
    return flips


def top_k(records, flips, name):
    """({flip index} of the model's TOP_K most preferred flips in its score file of this input, the file or None)."""
    for suffix in (f"LGIP_fliptypes_{name}.scores.jsonl", f"LGIP_{name}.scores.jsonl"):
        path = common.metrics_path(JSONL_PATH, suffix)
        if TOP_K and os.path.isfile(path):
            where = {(records[k][0], i, f): j for j, (k, i, f, _) in reversed(list(enumerate(flips)))}
            gaps = sorted((gap, where[(line, i, f)]) for line, i, f, gap in common.read_flip_gaps(path) if (line, i, f) in where)
            return {j for _, j in gaps[:TOP_K]}, path
    return set(), None


def score_protocol(path):
    """The PROTOCOL a score file's evaluation ran with, from the metrics file beside it; None when unknown."""
    for suffix in ("LGIP_fliptypes.metrics.json", "LGIP_ALL.metrics.json"):
        try:
            for m in common.read_json(common.metrics_path(JSONL_PATH, suffix)):
                if m.get("scores_file") == os.path.basename(path):
                    return m["run"]["config"]["PROTOCOL"]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return None


def attribute_texts(enc, tower, keys, embs):
    """{(record, text): (s, Alignment, token scores)} for each (record position, text); None where
    the tokens cannot be put on the text's words."""
    import torch
    aligned = common.align_words(enc.tokenize, [text for _, text in keys], TEMPLATE)
    out = {key: None for key, al in zip(keys, aligned) if al is None}
    todo = [(key, al) for key, al in zip(keys, aligned) if al is not None]
    for start in range(0, len(todo), TEXT_BATCH_SIZE):
        batch = todo[start:start + TEXT_BATCH_SIZE]
        ids = common.pad_ids(enc, [al.ids for _, al in batch])
        if start == 0:
            enc.info = dict(enc.info, attribution_embedding_diff=common.check_tower(tower, ids))
        s, scores = common.attribute(tower, ids, torch.stack([embs[k] for (k, _), _ in batch]), LAYERS)
        for r, (key, al) in enumerate(batch):
            out[key] = (float(s[r]), al, scores[r, al.token_pos].tolist())
    return out


def similarities(enc, tower, keys, embs):
    """{(record, text): cos(image, text)} of the texts as written, as LGIP scores them (a TEMPLATE
    run's gap, and its detected / preferred split, are LGIP's)."""
    import torch
    out = {}
    for start in range(0, len(keys), TEXT_BATCH_SIZE):
        batch = keys[start:start + TEXT_BATCH_SIZE]
        ids = common.pad_ids(enc, enc.tokenize([text for _, text in batch]))
        out.update(zip(batch, common.similarity(tower, ids, torch.stack([embs[k] for k, _ in batch])).tolist()))
    return out


def explain(enc, tower, names, records, flips, drawn):
    """The explain file's lines, the flips left out {why: count}, and the unreadable images' report."""
    root = IMAGE_ROOT or os.path.dirname(os.path.abspath(JSONL_PATH))
    embs, ok, failed = common.encode_record_images(enc, records, root, IMAGE_BATCH_SIZE, NUM_WORKERS,
                                                   indices=sorted({flips[j][0] for j in drawn}))
    ok = set(ok)
    keep = [j for j in sorted(drawn) if flips[j][0] in ok]
    keys = list(dict.fromkeys(key for j in keep for k, i, f, _ in [flips[j]]
                              for key in ((k, records[k][1]["orig_captions"][i]), (k, f))))
    done = attribute_texts(enc, tower, keys, embs)
    written = similarities(enc, tower, keys, embs) if TEMPLATE else None
    lines, skipped = [], {"image_unreadable": len(drawn) - len(keep), "tokens_not_on_words": 0, "no_scored_changed_word": 0}
    for j in keep:
        k, i, flip, flip_type = flips[j]
        line, rec = records[k]
        caption = rec["orig_captions"][i]
        if done[(k, caption)] is None or done[(k, flip)] is None:
            skipped["tokens_not_on_words"] += 1
            continue
        (s_cap, cal, cap_scores), (s_flip, al, scores) = done[(k, caption)], done[(k, flip)]
        words = common.word_scores(scores, al.token_word, len(al.words))
        changed = common.changed_words(caption, flip)
        if not changed or any(words[w] is None for w in changed):
            skipped["no_scored_changed_word"] += 1
            continue
        blamed = common.blamed_word(words)
        sims = {"sim_caption": s_cap, "sim_flip": s_flip}
        if written is not None:  # LGIP's gap, as written; the template's similarities, attributed, beside it
            sims = {"sim_caption": written[(k, caption)], "sim_flip": written[(k, flip)],
                    "sim_caption_template": s_cap, "sim_flip_template": s_flip}
        lines.append({"line": line, "image_path": rec["image_path"], "caption_index": i, "caption": caption, "flip": flip,
                      "flip_type": flip_type, "drawn": drawn[j], **sims,
                      "gap": sims["sim_caption"] - sims["sim_flip"], "tokens": names([al.ids[p] for p in al.token_pos]), "token_words": al.token_word,
                      "token_scores": scores, "words": al.words, "word_scores": words, "changed": changed,
                      "blamed": blamed, "hit": blamed in changed, "caption_words": cal.words,
                      "caption_word_scores": common.word_scores(cap_scores, cal.token_word, len(cal.words))})
    return lines, skipped, failed


def localization(lines):
    """localization_acc (with its interval) over all these lines, those the model detects (gap > 0)
    and those it prefers (gap <= 0); chance: the mean share of a flip's words that changed."""
    hit = np.array([line["hit"] for line in lines], dtype=np.float64)
    gap, idx = np.array([line["gap"] for line in lines]), np.arange(len(lines))
    block = {"count": len(lines), "localization_acc": common.mean_or_none(hit)}
    common.add_ci(block, "localization_acc", idx, hit, BOOTSTRAP, BOOTSTRAP_SEED)
    for name, sel in (("detected", gap > 0), ("preferred", gap <= 0)):
        block[f"localization_acc_{name}"] = common.mean_or_none(hit[sel])
        common.add_ci(block, f"localization_acc_{name}", idx[sel], hit[sel], BOOTSTRAP, BOOTSTRAP_SEED)
        block[f"num_{name}"] = int(sel.sum())
    block["chance"] = common.mean_or_none([len(line["changed"]) / len(line["words"]) for line in lines])
    return block


def type_order(flip_type):
    return (common.FLIP_TYPES.index(flip_type), "") if flip_type in common.FLIP_TYPES else (len(common.FLIP_TYPES), flip_type)


def explain_model(enc, spec, records, flips, sample):
    """One model's metrics (with its image report and family, for the run block), its explain file
    written; {"unsupported": why} for a family word attribution cannot explain (UNSUPPORTED "skip")."""
    try:
        tower = common.text_tower(getattr(enc, "model", None))  # an unsupported family: named, with the supported ones
    except common.ModelError as e:
        if UNSUPPORTED == "stop":
            raise
        return {"model_tag": enc.name, "num_flips": 0, "unsupported": str(e), "image_report": {}, "family": None}
    top, score_file = top_k(records, flips, enc.name)
    protocol = score_file and score_protocol(score_file)
    if protocol not in (None, "corrected"):
        print(f"{enc.name}: note: its TOP_K flips are those {os.path.basename(score_file)} scores lowest, under "
              f"PROTOCOL={protocol!r}; they are explained as the corrected protocol encodes them", flush=True)
    drawn = {j: ["random"] * (j in sample) + ["top_k"] * (j in top) for j in sample | top}
    with common.in_fp32(enc) as cast:  # (a model in memory runs in its own dtype: in fp32 here, then back)
        lines, skipped, failed = explain(enc, tower, common.token_namer(enc), records, flips, drawn)
    if cast:
        enc.info = dict(enc.info, attribution_in_fp32_from=cast)
    path = common.metrics_path(JSONL_PATH, f"LGIP_explain_{enc.name}.jsonl")
    with common.atomic_open(path) as f:
        f.writelines(common.dump_jsonl_line(line) for line in lines)
    block = localization(lines)
    return {"model_tag": enc.name, "num_flips": block.pop("count"), **block,
            "by_flip_type": {ft: localization([x for x in lines if x["flip_type"] == ft])
                             for ft in sorted({x["flip_type"] for x in lines}, key=type_order)},
            "num_random": sum("random" in x["drawn"] for x in lines), "num_top_k": sum("top_k" in x["drawn"] for x in lines),
            "skipped": skipped, "explain_file": os.path.basename(path), "score_file": score_file and os.path.basename(score_file),
            "score_file_protocol": protocol,
            "image_report": failed, "family": tower.family}


def run(**constants):
    """The command line's run, and a call from Python: the constants above as keyword arguments,
    in force for this call only; returns the list of per-model metrics dicts it writes."""
    with common.script_call(globals(), constants) as config:
        return explain_all(config)


def explain_all(config):
    check_config(config)
    records = common.load_records(JSONL_PATH, ("diff_caps", "diff_caps_*"))
    flips = all_flips(records)
    common.require_models(MODELS)  # before the first model's work
    n = len(flips) if N_FLIPS is None else min(N_FLIPS, len(flips))
    sample = set(random.Random(SEED).sample(range(len(flips)), n))
    print(f"{len(records)} records, {len(flips)} flips; explaining {n} drawn with seed {SEED} (+ TOP_K {TOP_K} per model)")
    results = []
    for spec in MODELS:
        with common.Timer() as t:
            enc = common.load_model(spec, "corrected", DEVICE, "fp32")
            try:
                m = explain_model(enc, spec, records, flips, sample)
            finally:
                if enc.release is not None:
                    enc.release()  # (a caller's model in memory: back in the mode it came in)
        m["run"] = dict(common.eval_run_info(__file__, config, enc, m.pop("image_report"), len(records)),
                        seconds=round(t.seconds, 3), family=m.pop("family"))
        results.append(m)
        if "unsupported" in m:
            print(f"{enc.name}: skipped: {m['unsupported']}", flush=True)
            continue
        print(f"{enc.name}: localization {common.fmt(m['localization_acc'], '.3f')} (detected "
              f"{common.fmt(m['localization_acc_detected'], '.3f')}, preferred {common.fmt(m['localization_acc_preferred'], '.3f')}, "
              f"chance {common.fmt(m['chance'], '.3f')}) over {m['num_flips']} flips, {t.seconds:.1f} s -> "
              f"{m['explain_file']}" + (f"; left out: {', '.join(f'{v} {k}' for k, v in m['skipped'].items() if v)}"
                                       if any(m["skipped"].values()) else ""))
    print(f"-> {common.write_rows(common.metrics_path(JSONL_PATH, 'LGIP_explain.metrics.json'), results)}")
    return results


if __name__ == "__main__":
    common.run_main(run)
