r"""rebuttal_enhanced_lgip_by_transformation: strength-aware sensitivity and paraphrase-kind analysis.

LGIP_SPEC.md section 4. Reads `rebuttal_enhanced_<stem>_with_fliptypes.jsonl` and writes all
models' results to `<that stem>__ENHANCED_LGIP_analysis.json` next to it.

The published fields keep the published computation (so numbers stay comparable), defects
included: `num_samples` counts batches of 32 records, and every flip enters the global figures
twice (once as "all", once typed). Corrected figures sit beside them under `corrected`: the
true record count, each flip counted once, and `combined_caps` (paraphrase + flip) evaluated.
  python rebuttal_enhanced_lgip_by_transformation.py \
    --JSONL_PATH=rebuttal_enhanced_lgip_coco_native5_train2017_with_fliptypes.jsonl
"""

import os

import numpy as np

import common

_HERE = os.path.dirname(os.path.abspath(__file__))
JSONL_PATH = os.path.join(
    _HERE, "rebuttal_enhanced_lgip_coco_native5_train2017_with_fliptypes.jsonl"
)  # input: the enhanced generator's output
IMAGE_ROOT = None  # folder that image_path is relative to; None = the JSONL's folder
OUTPUT_DIR = None  # folder for the outputs (metrics, score files), created when missing; None = beside JSONL_PATH
MODELS = common.PUBLISHED_MODELS  # list of model specs {"name", "type", ...} (the types and their keys: --help,
#   README "Models") or names: "demo" (the bundled tiny random model), a published model's name
SHARD = None  # None (every model), "i/n" (0 <= i < n: models i, i + n, i + 2n, ... of the expanded MODELS: one job of
#   n; the jobs' rows merge in the same files) or "slurm" (i and n from SLURM_ARRAY_TASK_ID, _MIN and _COUNT)
ON_MODEL_ERROR = "stop"  # "stop" (a model that cannot be had, loaded or run stops the run) or "skip" (it is left out
#   and recorded in each row's run.skipped_models; the run fails only when every model does)
PROTOCOL = "corrected"  # "corrected" (texts encoded as each model was trained) or "reference" (as the published code)
DEVICE = "auto"  # "auto" (cuda if available), "cpu", "cuda", "cuda:1", ...
DTYPE = "auto"  # "auto" (bf16 on CUDA, fp32 on CPU), "fp32", "bf16", "fp16"
IMAGE_BATCH_SIZE = 64  # int >= 1: images per forward pass
TEXT_BATCH_SIZE = "auto"  # int >= 1, or "auto" (2048 on CUDA, 64 on CPU): texts per forward pass (CLIP family: about 16
#   token positions per text, in prefix packs of 128)
NUM_WORKERS = (
    None  # int >= 0 (0: decoded in the main process): image-decoding worker processes; None = from the CPU count
)
CACHE_DIR = "auto"  # embedding cache folder; "auto" = .lgip_cache beside the input; None = no cache
CACHE_FLUSH_S = 60  # float >= 0: cache chunks are also written after this many seconds of work, so a crash loses at
#   most about that much
PIXEL_MEMORY_GB = "auto"  # float >= 0: host memory for decoded pixels kept for the next model with the same
#   preprocessing (each image decoded once per geometry); "auto" = a quarter of the memory this process may use (per
#   torchrun process on a node), 0 = off
LOOKAHEAD = True  # True: while a model runs, the later models' tokenizing and image decoding are done in low-priority
#   background workers (their GPU then never waits for them); False: each model does its own
ACCELERATIONS_OFF = []  # list of names from lgip/accelerations.py to switch off, or "all": the plain computation
#   (slower; the same numbers to float rounding)
BOOTSTRAP = 1000  # int >= 0: bootstrap resamples of the images for the *_ci95 fields; 0 = no intervals
BOOTSTRAP_SEED = 0  # int: seed of the bootstrap resampling
WRITE_SCORES = True  # True: also write per-pair similarities to <stem>__ENHANCED_LGIP_<model>.scores.jsonl
EXPORT = None  # None, "csv" or "parquet": the per-pair scores also as one table, <stem>__LGIP_<script>_pairs.csv
TRACKERS = []  # list of "wandb", "mlflow", "tensorboard": each model's figures also logged there (docs/outputs.md)
VERBOSE = True  # True: every line (paths written, comparisons, notes); False: the result lines (run_all's default)
CONFIG = common.configure(globals())

SIMPLE_MARKERS = ["a photo of", "an image of", "a picture of", "in this image", "in the picture", "this image shows"]
PRIORS = {"color": 0.25, "number": 0.55, "object": 1.0, "spatial": 0.80, "all": 0.60}
PUBLISHED_BATCH = 32  # the published script's record batch (IMAGE_BATCH_SIZE): its num_samples counts these, and one
#   unreadable image drops its whole batch
PUBLISHED_TEXT_BATCH = 512  # the published encode_text's batch: a longer call is padded per 512 texts


def strength(ftype, text_cos):
    """A flip's strength from its type's prior and its text distance; text_cos None (a joint scorer has
    no text embeddings, LGIP_SPEC.md 13): from the prior alone, s = clip01(prior[type])."""
    prior = np.array([PRIORS.get(t, PRIORS["all"]) for t in ftype])
    if text_cos is None:
        return np.clip(prior, 0.0, 1.0)
    d = np.clip(1.0 - text_cos, 0.0, 1.0)
    return np.clip(0.5 * prior + 0.5 * d, 0.0, 1.0)


def block(gaps, weights):
    """count, gap_mean, gap_std (n-1), pos_rate and their strength-weighted versions."""
    n = len(gaps)
    if n == 0:
        return {
            k: (0 if k == "count" else None)
            for k in ("count", "gap_mean", "gap_std", "pos_rate", "w_gap_mean", "w_pos_rate")
        }
    return {
        "count": n,
        "gap_mean": float(gaps.mean()),
        "gap_std": float(gaps.std(ddof=1)) if n > 1 else 0.0,
        "pos_rate": float((gaps > 0).mean()),
        "w_gap_mean": float((gaps * weights).sum() / weights.sum()),
        "w_pos_rate": float(weights[gaps > 0].sum() / weights.sum()),
    }


def strength_analysis(types, gaps, s, rec_idx, published=False):
    """Global figures plus per-type weak/medium/strong bins, as the published script computes them
    (published: with no flips at all its bin edges are 0.0 and 1.0; else None)."""
    w = np.maximum(1e-4, s)
    no_edges = (0.0, 1.0) if published else (None, None)
    # published: in float32, as torch.quantile on the published list, so a strength that is itself
    # an edge falls in the published bin (its float32 edge may round below it); corrected: float64,
    # where such a strength is always in the lower bin, whatever the last bits of its value
    q_low, q_high = (
        (float(q) for q in np.quantile(s.astype(np.float32) if published else s, [0.25, 0.75])) if len(s) else no_edges
    )
    bins = np.where(s <= q_low, "weak", np.where(s <= q_high, "medium", "strong")) if len(s) else s
    stats = {}
    for t in dict.fromkeys(types):  # types in order of first appearance
        m = types == t
        stats[t] = {"overall": block(gaps[m], w[m])}
        for b in ("weak", "medium", "strong"):
            stats[t][b] = block(gaps[m & (bins == b)], w[m & (bins == b)])
    full = block(gaps, w)
    sens = {k: full[k] for k in ("count", "gap_mean", "gap_std", "pos_rate")}
    common.add_ci(sens, "gap_mean", rec_idx, gaps, BOOTSTRAP, BOOTSTRAP_SEED)
    common.add_ci(sens, "pos_rate", rec_idx, gaps > 0, BOOTSTRAP, BOOTSTRAP_SEED)
    return {
        "global_sensitivity": sens,
        "global_strength": {"count": len(s), "strength_mean": common.mean_or_none(s), "q_low": q_low, "q_high": q_high},
        "global_weighted_sensitivity": {k: full[k] for k in ("count", "w_gap_mean", "w_pos_rate")},
        "error_type_stats": stats,
    }


def flip_type(field):
    """The published type of a flip field: diff_caps -> all, diff_caps_color -> color (lowercased, stripped)."""
    t = field.lower().strip().replace("flip_", "").replace("diff_caps_", "")
    return "all" if field == "diff_caps" else t


def published_calls(records, ks, calls):
    """The published script's encode_text calls over records ks, as data (lgip.texts.TextCalls), then
    the combined flips' own calls, and the pairs they make: (paraphrases, flips, combined)."""
    para, flips, combined = common.Pairs(), common.Pairs(), common.Pairs()
    orig_of = {}
    for k in ks:
        rec = records[k][1]
        orig = orig_of[k] = calls.add_call(rec["orig_captions"], PUBLISHED_TEXT_BATCH, captions_of=k)
        flip_fields = ["diff_caps"] + [f for f in rec if f.startswith("diff_caps_")]
        for i in range(len(rec["orig_captions"])):
            texts = common.caption_texts(rec, "same_caps", i)
            simple = [p for p in texts if any(m in p.lower() for m in SIMPLE_MARKERS)]
            advanced = [p for p in texts if not any(m in p.lower() for m in SIMPLE_MARKERS)]
            # published calls: simple and advanced paraphrases apart, then ONE call of all flip items
            para.add(k, i, orig[i], calls.add_call(simple, PUBLISHED_TEXT_BATCH), simple, "simple")
            para.add(k, i, orig[i], calls.add_call(advanced, PUBLISHED_TEXT_BATCH), advanced, "advanced")
            lists = [(flip_type(f), common.caption_texts(rec, f, i)) for f in flip_fields]  # "all" first, then typed
            slots = calls.add_call([t for _, texts in lists for t in texts], PUBLISHED_TEXT_BATCH)
            for ftype, texts in lists:
                flips.add(k, i, orig[i], slots[: len(texts)], texts, ftype)
                slots = slots[len(texts) :]
    for k in ks:  # never encoded by the published script: calls of their own, after all the published ones
        rec = records[k][1]
        for i in range(len(rec["orig_captions"])):
            for item in rec.get("combined_caps", {}).get(str(i), []):
                combined.add(k, i, orig_of[k][i], calls.add_call([item["text"]]), [item["text"]], item["combined_type"])
    return para, flips, combined


def invariance(para, terms=None):
    """The paraphrase figures: all, simple and advanced (and each kind's relative invariance error over
    the denominator `terms`, LGIP_SPEC.md 13)."""
    inv, kinds, rec_of = np.abs(para.base_sim - para.sim), para.labels, np.asarray(para.rec)
    m = {
        "global_invariance_error_mean": common.mean_or_none(inv),
        "paraphrase_simple_inv_error_mean": common.mean_or_none(inv[kinds == "simple"]),
        "paraphrase_advanced_inv_error_mean": common.mean_or_none(inv[kinds == "advanced"]),
        "paraphrase_simple_count": int((kinds == "simple").sum()),
        "paraphrase_advanced_count": int((kinds == "advanced").sum()),
    }
    common.add_ci(m, "global_invariance_error_mean", rec_of, inv, BOOTSTRAP, BOOTSTRAP_SEED)
    for kind in ("simple", "advanced"):
        common.add_ci(
            m, f"paraphrase_{kind}_inv_error_mean", rec_of[kinds == kind], inv[kinds == kind], BOOTSTRAP, BOOTSTRAP_SEED
        )
    for kind in ("simple", "advanced"):
        common.relative_figures(
            m,
            f"paraphrase_{kind}_inv_error_rel",
            rec_of[kinds == kind],
            inv[kinds == kind],
            terms,
            BOOTSTRAP,
            BOOTSTRAP_SEED,
        )
    return m


_ONCE = {}  # the flips' record list -> its once mask: the run's models share the lists (ModelRun.pairs)


def flips_once(flips):
    """Mask of each flip counted once: the typed items, and an "all" item only where no typed list
    of its caption holds its text (generator output always has one: every "all" item is dropped)."""
    if _ONCE.get("rec") is not flips.rec:
        typed = {(k, i, t) for k, i, t, f in zip(flips.rec, flips.cap, flips.text, flips.label) if f != "all"}
        once = np.fromiter(
            (f != "all" or (k, i, t) not in typed for k, i, t, f in zip(flips.rec, flips.cap, flips.text, flips.label)),
            bool,
            len(flips),
        )
        _ONCE.update(rec=flips.rec, once=once)
    return _ONCE["once"]


def evaluate(run):
    scored = run.score(*run.pairs(published_calls), text_cos=True, relative=True)
    para, flips, combined = scored.pairs  # (the pairs are built once per run)
    if not run.is_main:
        return None
    gaps, types = flips.base_sim - flips.sim, flips.labels
    text_cos = scored.gives("text_cos")  # (a scorer without text embeddings: strength from the prior)
    s = strength(types, flips.text_cos if text_cos else None)
    terms = common.relative_terms(scored.relative)
    rec_of = np.asarray(flips.rec)
    # published: an unreadable image drops its whole batch of 32 records, and num_samples counts batches
    dropped = sorted({k // PUBLISHED_BATCH for k in scored.failed})

    def kept(rec):  # positions of the pairs whose record's batch the published script kept
        return np.flatnonzero(~np.isin(np.asarray(rec) // PUBLISHED_BATCH, dropped)) if dropped else slice(None)

    kept_flips = kept(rec_of)
    corrected_inv = invariance(para, terms)
    m = {
        "model_tag": run.enc.name,
        "num_samples": -(-len(run.records) // PUBLISHED_BATCH) - len(dropped),  # batches of 32 records (see corrected)
        **(invariance(para.subset(kept(para.rec)), terms) if dropped else corrected_inv),
        **strength_analysis(types[kept_flips], gaps[kept_flips], s[kept_flips], rec_of[kept_flips], published=True),
    }
    once = flips_once(flips)
    c_gaps, c_types = combined.base_sim - combined.sim, combined.labels
    c_prior = np.array([t.split("+", 1)[-1] for t in c_types], dtype=object)
    m["corrected"] = {
        "num_records": scored.n_samples,
        **corrected_inv,
        **strength_analysis(types[once], gaps[once], s[once], rec_of[once]),
        "combined": strength_analysis(
            c_types, c_gaps, strength(c_prior, combined.text_cos if text_cos else None), combined.rec
        ),
        "published_batches_dropped": len(dropped),
    }
    m["strength_from"] = "text_distance" if text_cos else "prior"  # (LGIP_SPEC.md 13)
    if WRITE_SCORES:
        sidecar = common.ScoreSidecar(run.records, run.enc.score_kind)
        sidecar.add("paraphrases", para, kind=para.label)
        typed = np.flatnonzero(once)
        sidecar.add("flips", flips.subset(typed), type=types[typed], strength=common.PerModel(np.round(s[typed], 6)))
        sidecar.add("combined", combined, type=combined.label)
        path = common.score_file(JSONL_PATH, "enhanced", run.enc.name)
        m["scores_file"] = sidecar.save(
            path
        )  # its name; None when it could not be written (said; the metrics still are)
    return m


def summary(m):
    c = m["corrected"]
    f = common.fmt
    return (
        f"invariance error {f(m['global_invariance_error_mean'])} (simple {f(m['paraphrase_simple_inv_error_mean'])}, "
        f"advanced {f(m['paraphrase_advanced_inv_error_mean'])})\nflips once: gap "
        f"{f(c['global_sensitivity']['gap_mean'])}, positive rate {f(c['global_sensitivity']['pos_rate'], '.3f')}; "
        f"combined positive rate {f(c['combined']['global_sensitivity']['pos_rate'], '.3f')}"
    )


def run(**constants):
    """The command line's run, and a call from Python: the constants above as keyword arguments
    (`run(JSONL_PATH=..., MODELS=[...], WRITE_SCORES=False)`), in force for this call only; returns
    the list of per-model metrics dicts it writes (None on torchrun's other ranks)."""
    with common.script_call(globals(), constants) as config:
        results = common.run_evaluation(
            __file__, config, ("same_caps", "diff_caps", "diff_caps_*", "combined_caps"), evaluate, summary
        )
        if results is not None:
            common.write_results(__file__, config, results, "ENHANCED_LGIP_analysis.json")  # (then EXPORT, TRACKERS)
        return results


if __name__ == "__main__":
    common.run_main(run)
