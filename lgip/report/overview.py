"""lgip.report.overview: what the report says around its figures, once for the markdown and the
page: the evaluations found (a table), the package versions they ran with, where each figure
comes from and what it means (notes; per model, the file of its figures and when its row was made,
and the settings that differ between its files), the Pareto sentence, the rank correlation of LGIP with
retrieval across models, the word attribution's lines (one per model: its localization accuracy
against chance) and what the gallery's word scores cover, the demo banner (a run of the bundled
demo says so at the top), and what made the report. Every count says what it counts.

Texts are markdown inline text (`code` in backticks, **bold**): the markdown prints them as they
are, the page turns them into <code> and <strong>.

    >>> header, cells, versions = runs_table(metrics, found)
    >>> cells[0][:2]
    ['`run_lgip_multi.py`', '`x_with_perturb__LGIP_ALL.metrics.json`']
    >>> source_notes(rows, metrics, found)[0]
    'Invariance error, gap and positive rate from `run_lgip_multi.py` (`x_with_perturb__LGIP_ALL.metrics.json`).'
    >>> attribution_lines(rows, metrics, found)["lines"][0]["text"]      # the demo's, tiny models
    '`tiny_openclip`: localization 0.117 [0.052, 0.195] of 77 flips, chance 0.168: **at chance level** (its
     interval contains chance); detected 0.135 [0.027, 0.243] of 37 flips, preferred 0.100 [0.025, 0.200] of 40 flips.'
"""
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ..method import FLIP_TYPES
from .metrics import (COMPARED, COMPARED_OWN, DESCRIPTIVE_BELOW, EVAL_KEYS, EVALUATIONS, SCRIPTS, enhanced_blocks, mixed_text,
                      rank_correlations)
from .tables import cell, interval, row_types


@dataclass
class Report:
    """Everything the markdown and the page say, gathered by report.py; a later step adds a field
    (say retrieval metrics) and the writers that show it."""
    jsonl_path: str  # the JSONL_PATH the report is about
    rows: List[dict]  # one per model (lgip.report.metrics.build_rows)
    metrics: Dict[str, list]  # evaluation -> its per-model metrics
    paths: Dict[str, str]  # evaluation -> its metrics file
    prov: dict  # what made the report (lgip.util.provenance)
    front: Optional[list] = None  # the models on the Pareto frontier; None: no frontier figure
    figures: List[tuple] = field(default_factory=list)  # (png path, alt text) of each figure written
    tops: Any = None  # lgip.report.toplists.TopLists, or None when TOP_K = 0
    missing: list = field(default_factory=list)  # score files the metrics list but that are not there
    explain_missing: list = field(default_factory=list)  # (model, explain file) the explain metrics list but not there
    comparisons: list = field(default_factory=list)  # the paired comparisons read (lgip.report.metrics.load_comparisons)
    benchmark: Optional[dict] = None  # the imported benchmark the input is (lgip.report.metrics.benchmark_source), or None
    factors: Optional[dict] = None  # what predicts robustness (lgip.report.factors.compute_factors), or None
    factors_png: Optional[str] = None  # its figure, when written
    altered: Any = None  # the altered images preferred to their original (lgip.report.image_side.scan_altered), or None
    image_side_png: Optional[str] = None  # the image side beside the text side, when written
    top_k_per_model: bool = False  # the markdown's lists: per model, or one over all models
    max_text_chars: int = 0  # the markdown lists' captions cut to this many characters

    @property
    def stem(self):
        return os.path.splitext(os.path.basename(self.jsonl_path))[0]

    @property
    def protocols(self):
        return sorted({r["protocol"] or "unknown (no run info)" for r in self.rows})


def demo_note(metrics):
    """The demo banner's sentence when any metrics row the report reads was made by the bundled demo
    (its run block's `demo`: {"model": the tiny random-init model, "input": the synthetic images,
    "message"}), else None: what is demo, and that the figures show the pipeline working, not
    how any model behaves.

    >>> demo_note({"multi": [{"model_tag": "tiny", "run": {"demo": {"model": True, "input": True}}}]})
    'Demo run: synthetic images (not COCO photographs) and a tiny random-init model that knows nothing;
     these figures show that the pipeline works, not how any model behaves.'
    """
    flagged = [(m.get("model_tag"), (m.get("run") or {}).get("demo")) for ms in metrics.values() for m in ms]
    flagged = [(tag, d) for tag, d in flagged if d]
    if not flagged:
        return None
    tags = list(dict.fromkeys(m.get("model_tag") for ms in metrics.values() for m in ms))
    random_init = list(dict.fromkeys(tag for tag, d in flagged if isinstance(d, dict) and d.get("model")))
    synthetic = any(isinstance(d, dict) and d.get("input") for _, d in flagged)
    parts = ["synthetic images (not COCO photographs)"] if synthetic else []
    if random_init:
        parts.append(("a tiny random-init model that knows nothing" if len(random_init) == 1
                      else "tiny random-init models that know nothing")
                     + ("" if len(random_init) == len(tags) else f" ({', '.join(f'`{t}`' for t in random_init)})"))
    if parts:
        return ("Demo run: " + " and ".join(parts) + "; these figures show that the pipeline works, not how "
                + ("any model behaves." if random_init else "the models behave on real photographs."))
    messages = list(dict.fromkeys(str(d["message"]).strip() for _, d in flagged
                                  if isinstance(d, dict) and str(d.get("message") or "").strip()))
    return "Demo run: " + (" ".join(messages) if messages else
                           "made by the bundled demo; these figures show that the pipeline works, not how the models "
                           "behave on COCO.")


def random_init_note(metrics):
    """A warning when a model of the metrics ran without pretrained weights (its run block's
    `model.random_init`: an open_clip architecture named with no "pretrained"), else None. The demo
    model is random by design: the demo banner names it instead."""
    tags = list(dict.fromkeys(m.get("model_tag") for ms in metrics.values() for m in ms
                              if ((m.get("run") or {}).get("model") or {}).get("random_init")))
    if not tags:
        return None
    one = len(tags) == 1
    return (f"Random init: {', '.join(f'`{t}`' for t in tags)} ran without pretrained weights (no \"pretrained\" in "
            f"{'its spec' if one else 'their specs'}: open_clip built {'it' if one else 'them'} with random weights); "
            f"{'its' if one else 'their'} figures say nothing of a trained model.")


SINGLE_MODEL_NOTE = ("One model: what compares models (the Pareto frontier, LGIP beside retrieval and its figure, the "
                     "paired comparisons, what predicts robustness, the galleries' model filter) needs two or more, "
                     "so this page leaves it out; evaluate two or more models in one run to see it.")


def runs_table(metrics, paths):
    """(header, cells, versions) describing each evaluation found; versions: [(which, {package:
    version})], `which` naming the evaluations when they ran with different versions, else ''."""
    header = ["Evaluation", "Metrics file", "Input", "Protocol", "Models", "Records in file",
              "Records evaluated", "Unreadable images"]
    cells, versions = [], {}
    for e in EVALUATIONS:
        if e.key not in metrics:
            continue
        ms = metrics[e.key]
        runs = [m.get("run") or {} for m in ms]
        protocols = sorted({(r.get("model") or {}).get("protocol") or "?" for r in runs})
        inputs = sorted({(r.get("config") or {}).get("JSONL_PATH") or "?" for r in runs})
        in_file = sorted({str(r.get("num_records_in_file", "?")) for r in runs})
        evaluated = sorted({str(e.evaluated(m)) for m in ms})
        failed = [r.get("num_failed_images") for r in runs if r.get("num_failed_images") is not None]
        cells.append([f"`{e.script}`", f"`{os.path.basename(paths[e.key])}`",
                      ", ".join(f"`{os.path.basename(p)}`" if p != "?" else "?" for p in inputs),
                      ", ".join(protocols), str(len(ms)), ", ".join(in_file), ", ".join(evaluated),
                      str(max(failed)) if failed else "?"])
        for r in runs:
            if r.get("versions"):
                versions.setdefault(tuple(r["versions"].items()), []).append(e.key)
    listed = [("" if len(versions) == 1 else ", ".join(dict.fromkeys(keys)), dict(items))
              for items, keys in versions.items()]
    return header, cells, listed


def source_notes(rows, metrics, paths):
    """Where the table's figures come from, and what they mean (one sentence each)."""
    notes = []
    heads = list(dict.fromkeys(r["headline_source"] for r in rows if r["headline_source"]))

    def head(h):
        return (f"`{SCRIPTS[h]}` (`{os.path.basename(paths[h])}`"
                + (f", {enhanced_blocks(metrics[h][0])[2]} figures" if h == "enhanced" else "") + ")")
    if len(heads) > 1:  # (HEADLINE "auto": a model missing from the first file takes the next one's)
        notes.append("Invariance error, gap and positive rate from " + "; from ".join(
            head(h) + " for " + ", ".join(f"`{r['model']}`" for r in rows if r["headline_source"] == h)
            for h in heads) + ".")
    else:
        notes.append("Invariance error, gap and positive rate from " + ", ".join(head(h) for h in heads) + ".")
    typed = list(dict.fromkeys(r["flip_type_source"] for r in rows if r["flip_type_source"]))
    if typed:
        notes.append("Per-type positive rates from " + ", ".join(f"`{SCRIPTS[t]}`" for t in typed)
                     + (" (enhanced: corrected figures, no intervals)" if "enhanced" in typed else "") + ".")
    if "enhanced" in metrics:
        label = enhanced_blocks(metrics["enhanced"][0])[2]
        notes.append("Simple/advanced invariance error" + (" and combined (paraphrase + flip) positive rate"
                     if label == "corrected" else "") + f" from `{SCRIPTS['enhanced']}`, {label} figures"
                     + (" (each flip counted once, `combined_caps` evaluated)." if label == "corrected"
                        else " (no `corrected` block: an older analysis file)."))
    if "retrieval" in metrics:
        sizes = sorted({str(m.get("gallery_size", "?")) for m in metrics["retrieval"]})
        notes.append(f"I2T R@1 and flip top-1 from `{SCRIPTS['retrieval']}` (`{os.path.basename(paths['retrieval'])}`, "
                     f"galleries of {' or '.join(sizes)} records): I2T R@1 = share of images whose best caption ranks "
                     "first among the gallery's captions; flip top-1 = share of images whose most similar text is a flip "
                     "when the flips join the gallery (RoCOCO's false rate); every figure of section 7 is in the CSV.")
    if "explain" in metrics:
        notes.append(f"Localization accuracy (Loc. acc.) from `{SCRIPTS['explain']}` "
                     f"(`{os.path.basename(paths['explain'])}`): share of the explained flips whose blamed word is the changed one, [lo, hi] over flips "
                     "(see \"Which word does a model blame?\")"
                     + ("; its misalignment detection (F-CLIPScore against CLIPScore) is there and in the CSV (`detection_*`)."
                        if any("detection_ap_gain" in m for m in metrics["explain"]) else "."))
    if any(r.get("_controls") for r in rows):
        notes.append("Prior pos. and Grounded pos. from the flip pairs of the positive rate, each scored again against "
                     "the average of the other images (see \"Is it the image?\"): Prior pos. is a control, not a score (no "
                     "arrow: neither higher nor lower is better). In the CSV beside them: the prior and grounded gaps, the "
                     "invariance error's prior and grounded parts, the hard positives (`robust_pos_rate`: the image scores "
                     "the caption and every paraphrase above the flip, SugarCrepe++'s ITT; `text_only_rate`, its TOT), "
                     "each per flip type too.")
    notes += unmeasured_notes(rows, paths)
    notes += mixed_notes(rows, paths)
    notes.append("Invariance error = mean |sim(image, caption) − sim(image, paraphrase)|; gap = mean "
                 "sim(image, caption) − sim(image, flip); positive rate = share of flips with gap > 0 "
                 "(0.5 = chance). [lo, hi] = 95% bootstrap CI over images.")
    return notes


FIGURE_NAMES = {"invariance_error": "invariance error", "gap": "gap", "pos_rate": "positive rate"}


def unmeasured_notes(rows, paths):
    """One sentence per model whose headline figures are null in their file (an evaluation that
    had no such pairs): shown as –, and left out of the figures that need them."""
    return [f"`{r['model']}`: no {' and no '.join(FIGURE_NAMES[f] for f in r['_unmeasured'])} "
            f"(null in `{os.path.basename(paths[r['headline_source']])}`: nothing measured); shown as –, "
            "left out of the figures that need it." for r in rows if r.get("_unmeasured")]


def mixed_notes(rows, paths):
    """One sentence per model whose figures come from runs of different settings (lgip.report.metrics.
    mixed_settings: each list file keeps the rows of the models a later run did not evaluate):
    the model, each differing setting, and its value in each file."""
    return [f"`{r['model']}`: its figures come from runs of different settings: "
            + mixed_text(r["_mixed"], lambda key: f"`{os.path.basename(paths[key])}`") + "."
            for r in rows if r.get("_mixed")]


def sources_table(rows):
    """(header, cells): per model, the file its headline figures and its per-type figures come
    from, each with when that file's row was made (its run.created), and the settings that differ
    between its files (lgip.report.metrics.mixed_settings)."""
    header = ["Model", "Headline figures from", "Made", "Per-type figures from", "Made"]
    cells = [[f"`{r['model']}`", f"`{r['headline_file']}`" if r.get("headline_file") else "–", r.get("headline_created") or "–",
              f"`{r['flip_type_file']}`" if r.get("flip_type_file") else "–", r.get("flip_type_created") or "–"]
             for r in rows]
    return header, cells


def attribution_lines(rows, metrics, paths, missing=()):
    """{"lead", "lines": [{"model", "text"}], "missing", "detection"} of the word-attribution section:
    what localization accuracy and its detected / preferred parts mean, then one line per explained
    model with its figure, 95% interval and chance level, flagged when the interval contains
    chance; the explain files listed but missing (or None); and the misalignment detection's lines
    (detection_lines, or None). None without explain_flips.py metrics."""
    if "explain" not in metrics:
        return None
    layers = sorted({str(((m.get("run") or {}).get("config") or {}).get("LAYERS", "?")) for m in metrics["explain"]})
    lead = (f"From `{SCRIPTS['explain']}` (`{os.path.basename(paths['explain'])}`): each explained flip's "
            f"sim(image, flip) is attributed to its words (gradient × attention over the text tower's last "
            f"{' or '.join(layers)} layers) and its lowest-scoring word is blamed. Localization = share of the flips "
            "whose blamed word is the word the flip changed; chance = the share a randomly blamed word would get. "
            "Detected: over the flips the model scores below their caption (gap > 0): a hit says its lower score "
            "rests on the changed word. Preferred: over those it scores as high or higher (gap ≤ 0): a hit says it "
            "weighed the changed word and still preferred the flip. [lo, hi] = 95% bootstrap CI over flips.")
    explained = {m["model_tag"]: m for m in metrics["explain"]}
    lines = []
    for r in rows:
        if r["model"] not in explained:
            continue
        if r["localization_acc"] is None:
            why = explained[r["model"]].get("unsupported")
            lines.append({"model": r["model"], "text": f"`{r['model']}`: " + (f"not explained ({why})." if why else
                                                                            "no flip explained.")})
            continue
        lo, hi, chance = r["localization_acc_ci_lo"], r["localization_acc_ci_hi"], r["localization_chance"]
        where = ("" if lo is None or hi is None else
                 ": **at chance level** (its interval contains chance)" if lo <= chance <= hi else
                 ": below chance" if hi < chance else ": above chance")
        parts = [f"{name} {cell(r, key, 3)} of {r[count]} flips" if r[key] is not None else f"{name} – of {r[count] or 0} flips"
                 for name, key, count in (("detected", "localization_acc_detected", "localization_num_detected"),
                                          ("preferred", "localization_acc_preferred", "localization_num_preferred"))]
        lines.append({"model": r["model"],
                      "text": f"`{r['model']}`: localization {cell(r, 'localization_acc', 3)} of "
                              f"{r['localization_num_flips']} flips, chance {chance:.3f}{where}; " + ", ".join(parts) + "."})
    gone = ("Explain files listed in the metrics but missing: " + ", ".join(
        f"`{os.path.basename(p)}`" for _, p in missing) + " (their flips are shown without word scores).") if missing else None
    return {"lead": lead, "lines": lines, "missing": gone, "detection": detection_lines(rows, explained)}


DETECTION_LEAD = ("Misalignment detection (F-CLIPScore, after CLIP4DM; LGIP_SPEC.md section 8): each explained flip's "
                  "caption is attributed as its flip is, and a text's F-CLIPScore is F = (its blamed word's score) × "
                  "(1 − s / 2.5), s = cos(image, text) its CLIPScore. AP = average precision of telling the captions "
                  "(positives) from the flips (negatives) by F, and by s; F beats s when its AP is higher, by the "
                  "difference F − s, [lo, hi] its 95% bootstrap interval over records: an interval that excludes 0 is a "
                  "difference beyond resampling noise on these flips, nothing more (CLIP4DM's claim, tested on each model).")


def detection_line(r):
    """A model's misalignment detection in words, as explain_flips.py's console line says it
    (lgip.explain.detection_line), from its row; then the counts."""
    ap_s, ap_f, gain = r.get("detection_ap_clipscore"), r.get("detection_ap_fclipscore"), r.get("detection_ap_gain")
    if gain is None:
        return "misalignment detection: n/a (needs explained flips and their captions)"
    lo, hi = r.get("detection_ap_gain_ci_lo"), r.get("detection_ap_gain_ci_hi")
    where = "" if lo is None or hi is None else (f" [{lo:+.3f}, {hi:+.3f}]" + (
        "; the interval excludes 0" if lo > 0 or hi < 0 else "; the interval includes 0"))
    text = (f"misalignment detection (captions vs flips): AP by F-CLIPScore {ap_f:.3f}, by CLIPScore {ap_s:.3f}: "
            f"F {'beats' if gain > 0 else 'does not beat'} s by {gain:+.3f}{where}")
    counts = [f"{r[k]} {what}" for k, what in (("detection_num_captions", "captions"), ("detection_num_flips", "flips"))
              if r.get(k) is not None]
    return text + (f" ({', '.join(counts)})" if counts else "")


def detection_lines(rows, explained):
    """{"lead", "lines": [{"model", "text"}]}: a line per explained model saying whether F-CLIPScore beats
    CLIPScore at telling captions from flips, by how much, with its interval (detection_line); None when
    no explain metrics have the detection figures (written before them)."""
    if not any("detection_ap_gain" in m for m in explained.values()):
        return None
    lines = []
    for r in rows:
        m = explained.get(r["model"])
        if m is None:
            continue
        text = (detection_line(r) + "." if "detection_ap_gain" in m else
                "no misalignment detection in its explain metrics (written before F-CLIPScore: re-run `explain_flips.py`).")
        lines.append({"model": r["model"], "text": f"`{r['model']}`: {text}"})
    return {"lead": DETECTION_LEAD, "lines": lines}


def word_scores_note(rows, metrics, scored, cards):
    """What the flip gallery's word scores cover: `scored` of its `cards` flip cards have them, out of
    the flips explain_flips.py explained (per model, on its input); None without its metrics.

    >>> word_scores_note(rows, metrics, 3, 10)      # the demo, one tiny model
    '3 of the 10 flip cards on this page show word scores: `explain_flips.py` explained 77 flips of
     `tiny_openclip`, on `lgip_demo_with_fliptypes.jsonl`; a card whose flip is not among them shows none.'
    """
    if "explain" not in metrics:
        return None
    counts = {r["model"]: r["localization_num_flips"] for r in rows if r.get("localization_num_flips")}
    total = sum(counts.values())
    inputs = sorted({os.path.basename(((m.get("run") or {}).get("config") or {}).get("JSONL_PATH") or "")
                     for m in metrics["explain"]} - {""})
    def flips(n):
        return f"{n} flip{'s' if n != 1 else ''}"
    explained = (f"{flips(total)} of `{next(iter(counts))}`" if len(counts) == 1 else
                 f"{flips(next(iter(counts.values())))} of each of {len(counts)} models ({total} in all)"
                 if len(set(counts.values())) == 1 else f"{flips(total)} over {len(counts)} models" if counts else flips(0))
    return (f"{scored} of the {cards} flip card{'s' if cards != 1 else ''} on this page "
            f"{'shows' if scored == 1 else 'show'} word scores: `{SCRIPTS['explain']}` explained {explained}"
            + (f", on {', '.join(f'`{i}`' for i in inputs)}" if inputs else "")
            + "; a card whose flip is not among them shows none.")


def retrieval_note(rows):
    """The rank correlations across models between the LGIP positive rate and the retrieval
    figures (LGIP_SPEC.md 7), as one sentence; None without retrieval metrics. Under
    DESCRIPTIVE_BELOW models they are labelled descriptive: they describe those models only."""
    found = rank_correlations(rows)
    if not found:
        return None
    names = {"retrieval_i2t_recall@1": "image-to-text recall@1 (`i2t_recall@1`)",
             "retrieval_i2t_flip_top1_rate": "the flip top-1 rate (`i2t_flip_top1_rate`)"}
    parts = [f"with {names[c['x']]} ρ = {c['rho']:.2f}" if c["rho"] is not None else
             f"with {names[c['x']]} undefined (fewer than 3 models, or a figure equal for all)" for c in found]
    n = max(c["n"] for c in found)
    descriptive = any(c["descriptive"] for c in found)
    return (f"LGIP beside retrieval: across {n} model{'s' if n != 1 else ''}, Spearman's rank correlation of the LGIP "
            f"positive rate {' and '.join(parts)}"
            + (f" (**descriptive**: under {DESCRIPTIVE_BELOW} models a rank correlation describes these models, "
               "nothing more)." if descriptive else ".")
            + " Near 0: the order of the models by LGIP sensitivity is not the order retrieval gives them (the LGIP "
              "paper's claim that flip failures are largely invisible to standard retrieval).")


def frontier_note(front):
    """The Pareto sentence for the models on the frontier (tags, by invariance error)."""
    return ("Pareto frontier (no other model has both a lower invariance error and a higher positive rate): "
            + ", ".join(f"`{m}`" for m in front) + ".")


def missing_note(missing):
    """The score files the metrics list but that are not there, or empty, or None."""
    if not missing:
        return None
    absent = list(dict.fromkeys(f"`{os.path.basename(p)}`" for _, _, p in missing if not os.path.isfile(p)))
    empty = list(dict.fromkeys(f"`{os.path.basename(p)}`" for _, _, p in missing if os.path.isfile(p)))
    return " ".join(([f"Score files listed in the metrics but missing: {', '.join(absent)}."] if absent else [])
                    + ([f"Score files listed in the metrics but empty (their pairs are in no list): {', '.join(empty)}."]
                       if empty else []))


def made_by(prov):
    """'`report.py` on <time> (<settings>; <versions>)' from a provenance block."""
    settings = ", ".join(f"{k}={v!r}" for k, v in prov["config"].items() if k != "JSONL_PATH")
    return (f"`{prov['script']}` on {prov['created']} ({settings}; "
            + ", ".join(f"{k} {v}" for k, v in prov["versions"].items()) + ")")


def prior_line(r, file=None):
    """A model's line in plain words: how much of its positive rate the text alone reaches (its prior
    positive rate, the same flips scored against the average other image) and how often its own image
    decides (its grounded positive rate, against 0.5); or why there is none. `file`: the metrics file
    of its figures (named when it has no controls)."""
    tag, pos, prior, grounded = f"`{r['model']}`", r.get("pos_rate"), r.get("prior_pos_rate"), r.get("grounded_pos_rate")
    if not r.get("_controls"):
        return (f"{tag}: no text-prior control" + (f" in `{file}`" if file else "") + " (written before the controls, "
                "or by an evaluation without them: re-run `run_lgip_multi.py` or `run_lgip_by_fliptype.py`).")
    if pos is None:
        return f"{tag}: no flip measured (no positive rate), so no text-prior control."
    if prior is None:
        return (f"{tag}: positive rate {pos:.3f}; no text-prior control (fewer than 2 images: no other image to "
                "average).")
    if round(prior, 3) == round(pos, 3):
        head = f"of its {pos:.3f} positive rate, all ({prior:.3f}) is reached with any image: text prior"
    elif prior < pos:
        head = (f"of its {pos:.3f} positive rate, {prior:.3f} is reached with any image (text prior); its own images "
                f"add {pos - prior:.3f}")
    else:
        head = (f"its {pos:.3f} positive rate is below the {prior:.3f} it reaches with any image (text prior): its own "
                f"images take {prior - pos:.3f} away")
    if grounded is None:
        return f"{tag}: {head}."
    lo, hi = r.get("grounded_pos_rate_ci_lo"), r.get("grounded_pos_rate_ci_hi")
    where = ("" if lo is None or hi is None else "; its interval contains 0.5" if lo <= 0.5 <= hi else
             "; its interval lies above 0.5" if lo > 0.5 else "; its interval lies below 0.5")
    return (f"{tag}: {head}. On its own image the caption beats the flip by more than on the average image in "
            f"{cell(r, 'grounded_pos_rate', 3)} of pairs (grounded; 0.5 = the image decides nothing){where}.")


def prior_lines(rows, paths):
    """{"lead", "lines": [{"model", "text"}]} of the section "Is it the image?" (LGIP_SPEC.md section 9),
    a line per model (prior_line); None when no model's figures come with the controls (older files,
    or the enhanced analysis alone)."""
    if not any(r.get("_controls") for r in rows):
        return None
    heads = list(dict.fromkeys(r["headline_source"] for r in rows if r.get("_controls")))
    lead = ("Some flips read oddly (\"purple grass\", \"one dogs\"): a model can prefer the caption for text reasons "
            "alone. So " + " and ".join(f"`{SCRIPTS[h]}`" for h in heads) + " scored every caption-flip pair of the "
            "positive rate a second time, against the average of the OTHER images (LGIP_SPEC.md section 9). Reached "
            "\"with any image\" = the caption beats the flip on that average image: the prior positive rate (Prior pos., "
            "what a blind scorer gets; a positive rate near it is text prior, not grounding). Grounded pos. = share of "
            "pairs where the caption beats the flip by more on its own image than on the average one: 0.5 for a model "
            "that ignores the image, however strong its text prior; 1.0 when the image decides every pair. In the "
            "figure \"Positive rate against prior positive rate\", a model on the diagonal owes all of its positive "
            "rate to the text.")
    lines = [{"model": r["model"], "text": prior_line(r, os.path.basename(paths[r["headline_source"]])
                                                     if r.get("headline_source") in paths else None)} for r in rows]
    return {"lead": lead, "lines": lines}


COMPARED_NAMES = {"sensitivity_pos_rate": ("Pos. rate", 3), "grounded_pos_rate": ("Grounded pos.", 3),
                  "invariance_error_mean": ("Inv. error", 4), "i2t_recall@1": ("I2T R@1", 3),
                  "i2t_flip_top1_rate": ("Flip top-1", 3), "localization_acc": ("Loc. acc.", 3),
                  "image_sensitivity_pos_rate": ("Image pos.", 3)}  # a compared figure: its name in the tables, digits
EXCLUDES = "interval excludes 0"  # (a difference beyond resampling noise on these images, nothing more)


def _stale(c, by_model):
    """True when a model's value in comparison `c` is not its figure in the table's rows (the
    comparison from an earlier run than the figures), None when that cannot be told."""
    seen = []
    for model, value in ((c["a"], c["a_value"]), (c["b"], c["b_value"])):
        r, name = by_model.get(model), COMPARED.get(c["figure"])
        if r is None or value is None:
            continue
        if name is None:  # (a figure of its own evaluation: one key in a row)
            mine = r.get(COMPARED_OWN[c["figure"]]) if c["figure"] in COMPARED_OWN and c["flip_type"] is None else None
        elif c["flip_type"] is None:
            mine = r.get(f"{c['source']}_{name}")
        elif r.get("flip_type_source") == c["source"] and name != "invariance_error":
            mine = r.get(f"{c['flip_type']}_{name}")
        else:
            continue
        if mine is not None:
            seen.append(abs(mine - value) > 1e-9)
    return any(seen) if seen else None


def comparison_rows(comparisons, rows):
    """{"overall": [...], "by_type": [...]}: the paired comparisons as table rows, each a dict with
    the evaluation's script, figure (its name), flip type, the models (tag and label) with their
    values as text, the difference and its interval as text, images, whether the interval excludes 0
    (None: no interval) and `stale` (the values are not the table's: an earlier run's); in
    EVALUATIONS, figure, flip type and file order."""
    by_model = {r["model"]: r for r in rows}
    order = list(COMPARED) + list(COMPARED_OWN)
    types = list(dict.fromkeys(row_types(rows) + list(FLIP_TYPES)))

    def key(c):
        return (EVAL_KEYS.index(c["source"]) if c["source"] in EVAL_KEYS else len(EVAL_KEYS),
                order.index(c["figure"]) if c["figure"] in order else len(order),
                types.index(c["flip_type"]) if c["flip_type"] in types else len(types))
    out = {"overall": [], "by_type": []}
    for c in sorted(comparisons, key=key):
        name, digits = COMPARED_NAMES.get(c["figure"], (c["figure"], 4))

        def model(tag, value):
            r = by_model.get(tag)
            return {"tag": tag, "label": r["label"] if r else tag, "value": "–" if value is None else f"{value:.{digits}f}"}
        ci = interval({"d_ci_lo": c["lo"], "d_ci_hi": c["hi"]}, "d", digits)
        out["overall" if c["flip_type"] is None else "by_type"].append({
            "script": c["script"], "figure": name, "flip_type": c["flip_type"], "a": model(c["a"], c["a_value"]),
            "b": model(c["b"], c["b_value"]), "diff": "–" if c["diff"] is None else f"{c['diff']:+.{digits}f}",
            "ci": ci, "images": c["num_images"], "excludes_zero": c["excludes_zero"], "stale": _stale(c, by_model),
            "created": c["created"]})
    return out


def comparison_text(row):
    """What the last column of a comparison says: EXCLUDES, "—", or "— (no interval)"."""
    return EXCLUDES if row["excludes_zero"] else "—" if row["excludes_zero"] is not None else "— (no interval)"


COMPARISONS_LEAD = ("Each pair of models A, B evaluated in one run, on the same images: A − B with its 95% interval from "
                    "resampling the images, the same drawn images for both models. \"" + EXCLUDES + "\": a difference "
                    "beyond resampling noise on these images, nothing more (no claim about other images, settings or "
                    "model sizes); \"—\": the interval contains 0.")


def comparisons_notes(table, comparisons, rows):
    """Sentences under the comparisons table: the files read, and the rows whose values are not the
    table's (an earlier run's); or, with two models or more and no comparison, why there is none."""
    notes = []
    if comparisons:
        files = list(dict.fromkeys(c["file"] for c in comparisons))
        notes.append("From " + ", ".join(f"`{f}`" for f in files) + ".")
    elif sum(1 for r in rows if r.get("_controls")) >= 2:
        notes.append("No paired comparison: they are made for the models evaluated together in one run (each pair of "
                     "its MODELS), by `run_lgip_multi.py` and `run_lgip_by_fliptype.py` (and `run_lgip_retrieval.py`, "
                     "`explain_flips.py`, `run_lgip_images.py` for their own figures) in `<stem>__LGIP_comparisons."
                     "metrics.json`.")
    stale = [t for t in table["overall"] + table["by_type"] if t["stale"]]
    if stale:
        notes.append(f"† {len(stale)} comparison{'s' if len(stale) != 1 else ''}: a model's value is not its figure in the "
                     "results table: the comparison comes from an earlier run than the figures (a later run of one "
                     "model replaced its row); re-run the models together to compare them again.")
    return notes


# --- an imported benchmark's own table (LGIP_SPEC.md section 10) ---

def _bench_cell(r, key, digits, best):
    v = r.get(key)
    return {"text": "–" if v is None else f"{v:.{digits}f}", "ci": interval(r, key, digits), "value": v,
            "best": v is not None and v == best.get(key)}


def _bench_table(rows, spec, caption, groups=None):
    """{"caption", "groups", "header": [{text, sub, title}], "rows": [{model, label, cells}]} from spec
    [(header, sub, key, title)]: a figure per cell with its interval, the column's best (highest) bold."""
    best = {}
    for _, _, key, _ in spec:
        values = [r[key] for r in rows if r.get(key) is not None]
        best[key] = max(values) if len(values) > 1 else None
    return {"caption": caption, "groups": groups,
            "header": [{"text": h, "sub": sub, "title": title} for h, sub, _, title in spec],
            "rows": [{"model": r["model"], "label": r["label"], "cells": [_bench_cell(r, key, 3, best) for _, _, key, _ in spec]}
                     for r in rows]}


def benchmark_lines(rows, bench, paths):
    """{"title", "lead", "tables", "notes"} of the section "<Benchmark> table": the imported benchmark's
    results as its own paper tables them (rows = models; a column per type: its accuracy, the positive
    rate of that type's pairs, with its interval; their unweighted mean; SugarCrepe++'s ITT and TOT,
    the hard positives, overall and by type); None when the report is not about an imported benchmark
    (lgip.report.metrics.benchmark_source)."""
    if bench is None:
        return None
    types = row_types(rows)
    name = bench["name"]
    typed = list(dict.fromkeys(r["flip_type_source"] for r in rows if r.get("flip_type_source")))
    if not typed:
        return {"title": f"{name} table", "lead": f"No per-type figures: run `{SCRIPTS['fliptypes']}` on the file "
                "(run_all.py --BENCHMARK_JSONL=... does) for the benchmark's accuracy by type.", "tables": [], "notes": []}

    def count(t):
        counts = {r.get(f"{t}_count") for r in rows}
        if len(counts) != 1 or None in counts:
            return ""
        n = counts.pop()
        return f"{n} item{'s' if n != 1 else ''}"
    source = ", ".join(f"`{SCRIPTS[k]}` (`{os.path.basename(paths[k])}`)" if k in paths else f"`{SCRIPTS[k]}`" for k in typed)
    where = (f"{name}'s items as LGIP records (`import_benchmark.py`, `{os.path.basename(bench['meta_path'])}`)"
             if bench["meta"] is not None else "an input whose flip types are not LGIP's (no `import_benchmark.py` "
                                               "meta file beside it: the benchmark is not named)")
    accuracy = ("the benchmark's accuracy of that type: the positive rate of its pairs, the share whose image scores "
                "the caption above the negative (strictly, as the benchmark's own evaluation scores them)"
                if bench["accuracy"] else
                "the positive rate of that type's pairs, the share whose image scores the caption above its altered "
                "version (RoCOCO itself reports retrieval with the altered captions in the gallery: `run_lgip_retrieval.py`'s "
                "flip top-1 rate, by type in the CSV)" if bench["source"] == "rococo" else
                "the positive rate of that type's pairs, the share whose image scores the caption above the negative "
                "(the accuracy of a benchmark that scores pairs)")
    lead = (f"The input holds {where}, evaluated by {source}. Each type's column is {accuracy}, with its 95% interval "
            f"over images. Mean: the unweighted mean over the {len(types)} types, as the benchmarks report it (each type "
            "counts once, whatever its number of items; no interval).")
    spec = [(t, count(t), f"{t}_pos_rate", f"{t}: positive rate of its pairs (its accuracy)") for t in types]
    spec.append(("Mean", f"of {len(types)} types", "benchmark_mean_pos_rate", "unweighted mean over the types"))
    hard = any(r.get("robust_pos_rate") is not None for r in rows)
    if hard:
        spec += [("ITT", "robust_pos_rate", "robust_pos_rate", "the image scores the caption and its paraphrase above "
                                                                "the negative (SugarCrepe++'s ITT), over all pairs"),
                 ("TOT", "text_only_rate", "text_only_rate", "the text tower alone puts the paraphrase nearer the caption "
                                                              "than the negative (SugarCrepe++'s TOT), over all pairs")]
        lead += (" ITT (`robust_pos_rate`): the share of pairs where the image scores the caption AND its paraphrase "
                 "(SugarCrepe++'s second true caption) above the negative, SugarCrepe++'s image-to-text accuracy; TOT "
                 "(`text_only_rate`): the share where the text tower alone puts the paraphrase nearer the caption than "
                 "the negative, both ways, its text-only accuracy; both over all pairs here, by type below.")
    tables = [_bench_table(rows, spec, "Accuracy by type")]
    if any(r.get(f"{t}_robust_pos_rate") is not None for r in rows for t in types):
        by_type = []
        for t in types:
            by_type += [("ITT", t, f"{t}_robust_pos_rate", f"{t}: ITT (robust_pos_rate)"),
                        ("TOT", t, f"{t}_text_only_rate", f"{t}: TOT (text_only_rate)")]
        by_type += [("ITT", "mean", "benchmark_mean_robust_pos_rate", "unweighted mean of ITT over the types"),
                    ("TOT", "mean", "benchmark_mean_text_only_rate", "unweighted mean of TOT over the types")]
        tables.append(_bench_table(rows, by_type, "ITT and TOT by type", [(t, 2) for t in types] + [("Mean", 2)]))
    notes = []
    meta = bench["meta"] or {}
    if meta.get("num_images_missing"):
        written, total = meta.get("items_written_by_type") or {}, meta.get("items_by_type") or {}
        left = sum(total.values()) - sum(written.values()) if written and total else None
        notes.append(f"{meta['num_images_missing']} of the benchmark's {meta.get('num_images', '?')} images were found in "
                     f"no image folder when it was imported" + (f" ({left} items)" if left is not None else "")
                     + ": their items are not in these figures (listed in "
                     f"`{os.path.basename(bench['meta_path'])}`).")
    absent = [t for t, n in (meta.get("items_by_type") or {}).items() if t not in types]
    if absent:
        notes.append("Types of the benchmark with no item evaluated here: " + ", ".join(f"`{t}`" for t in absent) + ".")
    if meta.get("source_url"):
        notes.append(f"{name}: {meta['source_url']}.")
    return {"title": f"{name} table", "lead": lead, "tables": tables, "notes": notes}


# --- what predicts robustness (LGIP_SPEC.md section 12): the factors file as tables ---

FACTOR_NAMES = {"log10_params_total": "Parameters (log10)", "log10_samples_seen": "Samples seen (log10)",
                "image_size": "Image size", "family": "family", "training_data": "training data", "loss": "loss"}


def _models(n):
    return f"{n} model{'s' if n != 1 else ''}"


def _signed(v, digits):
    return f"{v:+.{digits}f}".replace("-", "−")


def factor_lines(factors):
    """{"lead", "header", "groups": [{"title", "rows": [{"label", "cells": [{"text", "sub"}]}]}], "pairs":
    {"header", "rows"}, "notes"} of the section "What predicts robustness" from the factors file's dict
    (lgip.report.factors.compute_factors); None without it or with fewer than two models (nothing to compare: the
    file has the one model's card and figures). A cell's `sub` is its interval and counts."""
    if factors is None or len(factors["models"]) < 2:
        return None
    from .factors import CATEGORICAL, MIN_LEVEL_MODELS, MIN_RHO_MODELS, NUMERIC, OUTCOME, UNKNOWN
    outcomes = factors["outcomes"]
    header = [OUTCOME[o][2] for o in outcomes]
    digits = {o: OUTCOME[o][3] for o in outcomes}
    resamples = factors["settings"]["resamples"]
    numeric = []
    for f, card_field, _ in NUMERIC:
        cells = []
        for o in outcomes:
            st = factors["numeric"][f][o]
            ci = st["rho_ci95"]
            cells.append({"text": "–" if st["rho"] is None else f"ρ {_signed(st['rho'], 2)}",
                          "sub": (f"[{_signed(ci[0], 2)}, {_signed(ci[1], 2)}] · " if ci else "") + _models(st["n"])
                          + (f" (under {MIN_RHO_MODELS})" if st["n"] < MIN_RHO_MODELS and st["n"] else "")})
        numeric.append({"label": FACTOR_NAMES[f], "title": f"{f}: the card's {card_field}", "cells": cells})
    groups = [{"title": f"Numeric: Spearman's ρ over the models with both values, [95% interval over {resamples} "
                        f"resamples of the models]; under {MIN_RHO_MODELS} models none", "rows": numeric}]
    for f in CATEGORICAL:
        by_outcome = factors["categorical"][f]
        levels = list(dict.fromkeys(lv["level"] for o in outcomes for lv in by_outcome[o]["levels"]))
        rows = []
        for level in levels:
            cells = []
            for o in outcomes:
                lv = next((x for x in by_outcome[o]["levels"] if x["level"] == level), None)
                cells.append({"text": "–", "sub": ""} if lv is None else
                             {"text": f"{lv['mean']:.{digits[o]}f}", "sub": _models(lv["n"])})
            rows.append({"label": f"{FACTOR_NAMES[f]}: {UNKNOWN if level is None else level}",
                         "title": f"mean over the models whose card's {f} is " + ("unknown (None)" if level is None else repr(level)),
                         "cells": cells})
        pairs = list(dict.fromkeys((c["a"], c["b"]) for o in outcomes for c in by_outcome[o]["compared"]))
        for a, b in pairs:
            cells = []
            for o in outcomes:
                c = next((x for x in by_outcome[o]["compared"] if (x["a"], x["b"]) == (a, b)), None)
                cells.append({"text": "–", "sub": ""} if c is None else
                             {"text": _signed(c["diff"], digits[o]), "sub": f"{c['n_a']} vs {c['n_b']} models"})
            rows.append({"label": f"{FACTOR_NAMES[f]}: {a} − {b}", "title": "difference of the two levels' means", "cells": cells})
        groups.append({"title": f"Categorical: {FACTOR_NAMES[f]}, the mean of each level (differences only between known "
                                f"levels of {MIN_LEVEL_MODELS} models or more)", "rows": rows})
    pair_rows = []
    for p in factors["controlled_pairs"]:
        cells = []
        for o in outcomes:
            d = p["outcomes"].get(o)
            if d is None:
                cells.append({"text": "–", "sub": ""})
                continue
            ci = d["diff_ci95"]
            cells.append({"text": _signed(d["diff"], digits[o]),
                          "sub": f"[{_signed(ci[0], digits[o])}, {_signed(ci[1], digits[o])}]" + (
                              " · excludes 0" if ci[0] > 0 or ci[1] < 0 else "") if ci else "no interval"})
        pair_rows.append({"a": p["a"], "b": p["b"], "why": p["why"], "cells": cells})
    n = len(factors["models"])
    cards = sum(1 for m in factors["models"] if any(v is not None for v in (m["card"] or {}).values()))
    lead = (f"Which property of a model goes with its figures, across the {_models(n)} here (LGIP_SPEC.md section 12, "
            "after the holistic CLIP study): each model's card (`model_card`: parameters counted, image size, training "
            "data and samples seen from its pretrained tag, family, loss; unknown where the card does not say) beside "
            "the table's figures. Numeric factors: Spearman's rank correlation ρ over the models (near +1: the larger the "
            "factor, the higher the figure). Categorical: each level's mean. Controlled pairs: two models differing in "
            "one factor only, their difference A − B with its 95% interval over images from the paired comparisons. "
            "Across a handful of models these describe those models, nothing more; `"
            f"{os.path.basename(factors.get('file') or '<stem>__LGIP_factors.metrics.json')}` has every figure.")
    notes = []
    if cards < n:
        notes.append(f"{n - cards} of the {_models(n)} have no model card in their metrics (made before the cards): "
                     "every factor unknown.")
    if not factors["controlled_pairs"]:
        notes.append("No controlled pair: no two models have the same architecture and different training data, nor the "
                     "same training data and family and a different size (a card field that is unknown matches nothing).")
    elif any(d["diff_ci95"] is None for p in factors["controlled_pairs"] for d in p["outcomes"].values()):
        notes.append("\"no interval\": the evaluation of that figure made no paired comparison of the pair (a figure it "
                     "does not compare, models evaluated in different runs, or `BOOTSTRAP=0`): the difference of the "
                     "figures alone.")
    return {"lead": lead, "header": header, "groups": groups,
            "pairs": {"header": ["A", "B", "Why"] + header, "rows": pair_rows}, "notes": notes}
