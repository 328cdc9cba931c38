"""lgip.report.overview: what the report says around its figures, once for the markdown and the
page: the evaluations found (a table), the package versions they ran with, where each figure
comes from and what it means (notes; per model, the file of its figures and when its row was made,
and the settings that differ between its files), the Pareto sentence, the rank correlation of LGIP with
retrieval across models, the demo banner (a run of the bundled demo says so at the top), a model run
without its weights, and what made the report. Every count says what it counts. The sections' own
texts are beside it: attribution_text (which word a model blames), controls_text (is it the image?
the paired comparisons), benchmark_text (an imported benchmark's table), factors_text (what predicts
robustness).

Texts are markdown inline text (`code` in backticks, **bold**): the markdown prints them as they
are, the page turns them into <code> and <strong>.

    >>> header, cells, versions = runs_table(metrics, found)
    >>> cells[0][:2]
    ['`run_lgip_multi.py`', '`x_with_perturb__LGIP_ALL.metrics.json`']
    >>> source_notes(rows, metrics, found)[0]
    'Invariance error, gap and positive rate from `run_lgip_multi.py` (`x_with_perturb__LGIP_ALL.metrics.json`).'
"""

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .evaluations import EVALUATIONS, SCRIPTS, mixed_text
from .extract import enhanced_blocks
from .rows import DESCRIPTIVE_BELOW, rank_correlations


@dataclass
class Report:
    """Everything the markdown and the page say, gathered by report.py; a later step adds a field
    (say retrieval metrics) and the writers that show it."""

    jsonl_path: str  # the JSONL_PATH the report is about
    rows: List[dict]  # one per model (lgip.report.build_rows)
    metrics: Dict[str, list]  # evaluation -> its per-model metrics
    paths: Dict[str, str]  # evaluation -> its metrics file
    prov: dict  # what made the report (lgip.util.provenance)
    front: Optional[list] = None  # the models on the Pareto frontier; None: no frontier figure
    figures: List[tuple] = field(default_factory=list)  # (png path, alt text) of each figure written
    tops: Any = None  # lgip.report.toplists.TopLists, or None when TOP_K = 0
    missing: list = field(default_factory=list)  # score files the metrics list but that are not there
    explain_missing: list = field(default_factory=list)  # (model, explain file) the explain metrics list but not there
    comparisons: list = field(default_factory=list)  # the paired comparisons read (lgip.report.load_comparisons)
    benchmark: Optional[dict] = None  # the imported benchmark the input is (lgip.report.benchmark_source), or None
    blind: Optional[dict] = None  # the blind audit of the input's flips (lgip.report.load_blind), or None
    finetune: Optional[dict] = None  # the fine-tuned arms among the models (lgip.report.load_finetune), or None
    finetune_png: Optional[str] = None  # their loss curves, when written
    classification: Optional[dict] = None  # run_lgip_classification.py's metrics (lgip.report.load_classification)
    effective_robustness: dict = field(default_factory=dict)  # {shift set: its fit or None} (LGIP_SPEC.md 16)
    classification_pngs: dict = field(default_factory=dict)  # {"reliability", "er", "tradeoff": png or None}
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
        parts.append(
            (
                "a tiny random-init model that knows nothing"
                if len(random_init) == 1
                else "tiny random-init models that know nothing"
            )
            + ("" if len(random_init) == len(tags) else f" ({', '.join(f'`{t}`' for t in random_init)})")
        )
    if parts:
        return (
            "Demo run: "
            + " and ".join(parts)
            + "; these figures show that the pipeline works, not how "
            + ("any model behaves." if random_init else "the models behave on real photographs.")
        )
    messages = list(
        dict.fromkeys(
            str(d["message"]).strip() for _, d in flagged if isinstance(d, dict) and str(d.get("message") or "").strip()
        )
    )
    return "Demo run: " + (
        " ".join(messages)
        if messages
        else "made by the bundled demo; these figures show that the pipeline works, not how the models behave on COCO."
    )


def random_init_note(metrics):
    """A warning when a model of the metrics ran without pretrained weights (its run block's
    `model.random_init`: an open_clip architecture named with no "pretrained"), else None. The demo
    model is random by design: the demo banner names it instead."""
    tags = list(
        dict.fromkeys(
            m.get("model_tag")
            for ms in metrics.values()
            for m in ms
            if ((m.get("run") or {}).get("model") or {}).get("random_init")
        )
    )
    if not tags:
        return None
    one = len(tags) == 1
    return (
        f'Random init: {", ".join(f"`{t}`" for t in tags)} ran without pretrained weights (no "pretrained" in '
        f"{'its spec' if one else 'their specs'}: open_clip built {'it' if one else 'them'} with random weights); "
        f"{'its' if one else 'their'} figures say nothing of a trained model."
    )


SINGLE_MODEL_NOTE = (
    "One model: what compares models (the Pareto frontier, LGIP beside retrieval and its figure, the "
    "paired comparisons, what predicts robustness, the galleries' model filter) needs two or more, "
    "so this page leaves it out; evaluate two or more models in one run to see it."
)


def runs_table(metrics, paths):
    """(header, cells, versions) describing each evaluation found; versions: [(which, {package:
    version})], `which` naming the evaluations when they ran with different versions, else ''."""
    header = [
        "Evaluation",
        "Metrics file",
        "Input",
        "Protocol",
        "Models",
        "Records in file",
        "Records evaluated",
        "Unreadable images",
    ]
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
        cells.append(
            [
                f"`{e.script}`",
                f"`{os.path.basename(paths[e.key])}`",
                ", ".join(f"`{os.path.basename(p)}`" if p != "?" else "?" for p in inputs),
                ", ".join(protocols),
                str(len(ms)),
                ", ".join(in_file),
                ", ".join(evaluated),
                str(max(failed)) if failed else "?",
            ]
        )
        for r in runs:
            if r.get("versions"):
                versions.setdefault(tuple(r["versions"].items()), []).append(e.key)
    listed = [
        ("" if len(versions) == 1 else ", ".join(dict.fromkeys(keys)), dict(items)) for items, keys in versions.items()
    ]
    return header, cells, listed


def source_notes(rows, metrics, paths):
    """Where the table's figures come from, and what they mean (one sentence each)."""
    notes = []
    heads = list(dict.fromkeys(r["headline_source"] for r in rows if r["headline_source"]))

    def head(h):
        return (
            f"`{SCRIPTS[h]}` (`{os.path.basename(paths[h])}`"
            + (f", {enhanced_blocks(metrics[h][0])[2]} figures" if h == "enhanced" else "")
            + ")"
        )

    if len(heads) > 1:  # (HEADLINE "auto": a model missing from the first file takes the next one's)
        notes.append(
            "Invariance error, gap and positive rate from "
            + "; from ".join(
                head(h) + " for " + ", ".join(f"`{r['model']}`" for r in rows if r["headline_source"] == h)
                for h in heads
            )
            + "."
        )
    else:
        notes.append("Invariance error, gap and positive rate from " + ", ".join(head(h) for h in heads) + ".")
    blind = [r for r in rows if r.get("reads_images") is False]
    if blind:  # (LGIP_SPEC.md 15: a text-only model runs through the evaluations as a control)
        one, names = len(blind) == 1, ", ".join(f"`{r['model']}`" for r in blind)
        notes.append(
            f"Text-prior control{'' if one else 's'}: {names} "
            f"(marked [text]) read{'s' if one else ''} no image: {'its' if one else 'their'} figures are what the "
            f"captions' text alone gives, the level a model that reads the image has to beat; "
            f"{'it has' if one else 'they have'} no image tower, no retrieval, word attribution or image side, and "
            f"{'is' if one else 'are'} left out of what predicts robustness."
        )
    kinds = list(dict.fromkeys(r.get("score_kind") or "cosine" for r in rows))
    if len(kinds) > 1:  # (LGIP_SPEC.md 13)
        notes.append(
            f"The models score in {len(kinds)} kinds ({', '.join(kinds)}, beside each name): invariance "
            f"error and gap are in each model's own units, comparable only between models of one kind; "
            f"Inv. rel. (the invariance error over how far another image's caption moves the score) and "
            f"the rates compare across kinds, and the frontier figure is drawn on Inv. rel."
        )
    elif kinds and kinds[0] != "cosine":
        notes.append(
            f"Scores are {kinds[0]} (LGIP_SPEC.md 13), not cosines: invariance error and gap are in its units."
        )
    if len(kinds) == 1 and any(r.get("invariance_error_rel") is not None for r in rows):
        notes.append(
            "Inv. rel. is the invariance error divided by how far another image's caption (the previous "
            "record's) moves the score: 0 when a paraphrase never moves it, 1 when it moves it as far; it "
            "compares across score kinds."
        )
    typed = list(dict.fromkeys(r["flip_type_source"] for r in rows if r["flip_type_source"]))
    if typed:
        notes.append(
            "Per-type positive rates from "
            + ", ".join(f"`{SCRIPTS[t]}`" for t in typed)
            + (" (enhanced: corrected figures, no intervals)" if "enhanced" in typed else "")
            + "."
        )
    if "enhanced" in metrics:
        label = enhanced_blocks(metrics["enhanced"][0])[2]
        notes.append(
            "Simple/advanced invariance error"
            + (" and combined (paraphrase + flip) positive rate" if label == "corrected" else "")
            + f" from `{SCRIPTS['enhanced']}`, {label} figures"
            + (
                " (each flip counted once, `combined_caps` evaluated)."
                if label == "corrected"
                else " (no `corrected` block: an older analysis file)."
            )
        )
    if "retrieval" in metrics:
        sizes = sorted({str(m.get("gallery_size", "?")) for m in metrics["retrieval"]})
        notes.append(
            f"I2T R@1 and flip top-1 from `{SCRIPTS['retrieval']}` (`{os.path.basename(paths['retrieval'])}`, "
            f"galleries of {' or '.join(sizes)} records): I2T R@1 = share of images whose best caption ranks "
            "first among the gallery's captions; flip top-1 = share of images whose most similar text is a flip "
            "when the flips join the gallery (RoCOCO's false rate); every figure of section 7 is in the CSV."
        )
    if "explain" in metrics:
        notes.append(
            f"Localization accuracy (Loc. acc.) from `{SCRIPTS['explain']}` "
            f"(`{os.path.basename(paths['explain'])}`): share of the explained flips whose blamed word is the changed "
            "one, [lo, hi] over flips "
            '(see "Which word does a model blame?")'
            + (
                "; its misalignment detection (F-CLIPScore against CLIPScore) is there and in the CSV (`detection_*`)."
                if any("detection_ap_gain" in m for m in metrics["explain"])
                else "."
            )
        )
    if any(r.get("_controls") for r in rows):
        notes.append(
            "Prior pos. and Grounded pos. from the flip pairs of the positive rate, each scored again against "
            'the average of the other images (see "Is it the image?"): Prior pos. is a control, not a score (no '
            "arrow: neither higher nor lower is better). In the CSV beside them: the prior and grounded gaps, the "
            "invariance error's prior and grounded parts, the hard positives (`robust_pos_rate`: the image scores "
            "the caption and every paraphrase above the flip, SugarCrepe++'s ITT; `text_only_rate`, its TOT), "
            "each per flip type too."
        )
    notes += unmeasured_notes(rows, paths)
    notes += mixed_notes(rows, paths)
    notes.append(
        "Invariance error = mean |sim(image, caption) − sim(image, paraphrase)|; gap = mean "
        "sim(image, caption) − sim(image, flip); positive rate = share of flips with gap > 0 "
        "(0.5 = chance). [lo, hi] = 95% bootstrap CI over images."
    )
    return notes


FIGURE_NAMES = {"invariance_error": "invariance error", "gap": "gap", "pos_rate": "positive rate"}


def unmeasured_notes(rows, paths):
    """One sentence per model whose headline figures are null in their file (an evaluation that
    had no such pairs): shown as –, and left out of the figures that need them."""
    return [
        f"`{r['model']}`: no {' and no '.join(FIGURE_NAMES[f] for f in r['_unmeasured'])} "
        f"(null in `{os.path.basename(paths[r['headline_source']])}`: nothing measured); shown as –, "
        "left out of the figures that need it."
        for r in rows
        if r.get("_unmeasured")
    ]


def mixed_notes(rows, paths):
    """One sentence per model whose figures come from runs of different settings (lgip.report.
    mixed_settings: each list file keeps the rows of the models a later run did not evaluate):
    the model, each differing setting, and its value in each file."""
    return [
        f"`{r['model']}`: its figures come from runs of different settings: "
        + mixed_text(r["_mixed"], lambda key: f"`{os.path.basename(paths[key])}`")
        + "."
        for r in rows
        if r.get("_mixed")
    ]


def sources_table(rows):
    """(header, cells): per model, the file its headline figures and its per-type figures come
    from, each with when that file's row was made (its run.created), and the settings that differ
    between its files (lgip.report.mixed_settings)."""
    header = ["Model", "Headline figures from", "Made", "Per-type figures from", "Made"]
    cells = [
        [
            f"`{r['model']}`",
            f"`{r['headline_file']}`" if r.get("headline_file") else "–",
            r.get("headline_created") or "–",
            f"`{r['flip_type_file']}`" if r.get("flip_type_file") else "–",
            r.get("flip_type_created") or "–",
        ]
        for r in rows
    ]
    return header, cells


def retrieval_note(rows):
    """The rank correlations across models between the LGIP positive rate and the retrieval
    figures (LGIP_SPEC.md 7), as one sentence; None without retrieval metrics. Under
    DESCRIPTIVE_BELOW models they are labelled descriptive: they describe those models only."""
    found = rank_correlations(rows)
    if not found:
        return None
    names = {
        "retrieval_i2t_recall@1": "image-to-text recall@1 (`i2t_recall@1`)",
        "retrieval_i2t_flip_top1_rate": "the flip top-1 rate (`i2t_flip_top1_rate`)",
    }
    parts = [
        f"with {names[c['x']]} ρ = {c['rho']:.2f}"
        if c["rho"] is not None
        else f"with {names[c['x']]} undefined (fewer than 3 models, or a figure equal for all)"
        for c in found
    ]
    n = max(c["n"] for c in found)
    descriptive = any(c["descriptive"] for c in found)
    return (
        f"LGIP beside retrieval: across {n} model{'s' if n != 1 else ''}, Spearman's rank correlation of the LGIP "
        f"positive rate {' and '.join(parts)}"
        + (
            f" (**descriptive**: under {DESCRIPTIVE_BELOW} models a rank correlation describes these models, "
            "nothing more)."
            if descriptive
            else "."
        )
        + " Near 0: the order of the models by LGIP sensitivity is not the order retrieval gives them (the LGIP "
        "paper's claim that flip failures are largely invisible to standard retrieval)."
    )


def frontier_note(front, rows=()):
    """The Pareto sentence for the models on the frontier (tags, by invariance error: the relative one where
    the rows' models score in several kinds, as the figure draws it)."""
    from .rows import mixed_kinds

    what = "relative invariance error" if mixed_kinds(rows) else "invariance error"
    return (
        f"Pareto frontier (no other model has both a lower {what} and a higher positive rate): "
        + ", ".join(f"`{m}`" for m in front)
        + "."
    )


def missing_note(missing):
    """The score files the metrics list but that are not there, or empty, or None."""
    if not missing:
        return None
    absent = list(dict.fromkeys(f"`{os.path.basename(p)}`" for _, _, p in missing if not os.path.isfile(p)))
    empty = list(dict.fromkeys(f"`{os.path.basename(p)}`" for _, _, p in missing if os.path.isfile(p)))
    return " ".join(
        ([f"Score files listed in the metrics but missing: {', '.join(absent)}."] if absent else [])
        + (
            [f"Score files listed in the metrics but empty (their pairs are in no list): {', '.join(empty)}."]
            if empty
            else []
        )
    )


def made_by(prov):
    """'`report.py` on <time> (<settings>; <versions>)' from a provenance block."""
    settings = ", ".join(f"{k}={v!r}" for k, v in prov["config"].items() if k != "JSONL_PATH")
    return (
        f"`{prov['script']}` on {prov['created']} ({settings}; "
        + ", ".join(f"{k} {v}" for k, v in prov["versions"].items())
        + ")"
    )
