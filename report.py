"""report: one report over every LGIP evaluation of a JSONL: a web page, markdown, CSV and plots.

Reads the metrics that run_lgip_multi.py, run_lgip_by_fliptype.py and
rebuttal_enhanced_lgip_by_transformation.py wrote for JSONL_PATH (the input of any of them, or
the base JSONL: then the derived inputs `<stem>_with_perturb.jsonl`, `<stem>_with_fliptypes.jsonl`
and `rebuttal_enhanced_<stem>_with_fliptypes.jsonl` beside it are looked at), all models,
run_lgip_retrieval.py's recall figures when it ran (in the table and CSV, a figure against the LGIP
positive rate, Spearman's rho across models), the text-prior controls and paired model comparisons
of run_lgip_multi.py and run_lgip_by_fliptype.py (how much of each model's positive rate the text
alone reaches: two table columns, a line per model in plain words, a figure, the comparisons as a
table; a gallery flip says whether the model prefers it on the average other image too, when its
score file has the flip's prior gap), and explain_flips.py's word attribution of the same flips when
it ran (localization accuracy per model; the gallery flips it explained get their words coloured by
score; a line per model on whether F-CLIPScore tells captions from flips better than CLIPScore), and
writes next to JSONL_PATH. On an imported benchmark (import_benchmark.py's file) the
per-type columns and figure follow the benchmark's own types, and a section reads like its own table.
Across the models, what predicts robustness: their model cards against their figures (LGIP_SPEC.md 12).
run_lgip_images.py's image side when it ran: three table columns, a line per model beside its text
figures, a figure, and the altered images a model prefers to their original beside it on the page.
  <stem>__LGIP_report.html    one self-contained page (opens by double-click from any folder): the
                              markdown's content, the results table sortable, the plots, and galleries
                              of the top flips and paraphrases with their images, filtered by model
                              and flip type
  <stem>__LGIP_report.md      inputs, protocol, models, counts, versions; main table; plots; top lists
  <stem>__LGIP_report.csv     one row per model, every figure, 95% CI bounds as separate columns
  <stem>__LGIP_frontier.png   invariance error against positive rate, CI whiskers, Pareto frontier
  <stem>__LGIP_prior.png      positive rate against prior positive rate (the text alone), the diagonal
                              drawn (when the evaluations wrote the text-prior controls)
  <stem>__LGIP_fliptypes.png  positive rate per flip type and model (when a typed evaluation ran)
  <stem>__LGIP_retrieval.png  positive rate against image-to-text recall@1 and the flip top-1 rate
                              (when run_lgip_retrieval.py ran)
  <stem>__LGIP_image_side.png image invariance error and positive rate against the text's (when
                              run_lgip_images.py ran)
  <stem>__LGIP_factors.metrics.json  what predicts robustness: rank correlations of the models' size,
                              samples seen and image size with each headline figure (intervals over
                              BOOTSTRAP resamples of the models), levels of family, training data and
                              loss, controlled pairs; with report.py's provenance
  <stem>__LGIP_factors.png    positive rate and grounded positive rate against parameters, by training
                              data (two models or more with a parameter count)
  <stem>__LGIP_finetune.png   each fine-tuned arm's loss curves (when the models include finetune_lgip.py's
                              arms: the report on a fine-tuning run's held-out file, LGIP_SPEC.md 14)
  <stem>__LGIP_classification_reliability.png, _er.png, _tradeoff.png, _er.metrics.json
                              when run_lgip_classification.py ran on JSONL_PATH (LGIP_SPEC.md 16): the id
                              set's reliability diagram, each shift set's effective robustness (its file:
                              the probit fit and each model's figure), and with fine-tuned arms the id set's
                              accuracy against the held-out positive rate (the arms and WiSE-FT points joined)
The top lists (paraphrases that move the score most, flips scored above their original) stream
the evaluations' per-pair score files, keeping only TOP_K rows. The table is printed too. Every
input is read and checked before any output is written, and the outputs are renamed into place
together at the end: bad input (a NaN, a string for a number, a truncated score file) stops with
file, model or line, and field (exit status 2), the previous report left whole. The machinery is
in lgip/report/ (a module per concern).
  python report.py --JSONL_PATH=lgip_coco_native5_train2017.jsonl
"""

import os
import sys

import common
from lgip.report import (
    OutputSet,
    Report,
    add_benchmark_means,
    altered_items,
    attach_attributions,
    benchmark_source,
    blind_file,
    build_rows,
    classification_file,
    comparison_files,
    compute_factors,
    console_table,
    csv_columns,
    demo_note,
    effective_robustness_all,
    explain_files,
    find_metrics,
    fliptype_figures,
    gallery_items,
    image_roots,
    image_score_files,
    load_blind,
    load_classification,
    load_finetune,
    load_debiased,
    load_comparisons,
    load_metrics,
    model_colors_hex,
    page_context,
    plot_er,
    plot_factors,
    plot_finetune,
    plot_fliptypes,
    plot_frontier,
    plot_image_side,
    plot_prior,
    plot_reliability,
    plot_retrieval,
    plot_tradeoff,
    random_init_note,
    render_page,
    report_types,
    scan_altered,
    scan_scores,
    score_files,
    seeds,
    subtitle,
    unmeasured_notes,
    write_csv,
    write_factors,
    write_markdown,
    write_page,
)

_HERE = os.path.dirname(os.path.abspath(__file__))
JSONL_PATH = os.path.join(_HERE, "lgip_coco_native5_train2017.jsonl")  # base JSONL,
#   or the input of any of the three evaluations
OUTPUT_DIR = None  # folder the evaluations wrote their metrics to (their OUTPUT_DIR),
#   and the report's folder; None = beside JSONL_PATH
OUTPUT_PREFIX = None  # str: outputs are <OUTPUT_PREFIX>report.md, ...frontier.png, ...;
#   None = "<JSONL folder>/<JSONL stem>__LGIP_" (with MODELS: "...__LGIP_<MODELS>_")
MODELS = None  # None = every model in the metrics; or a list of model names or fnmatch patterns (or one string "a,b"),
#   e.g. ["epoch*", "openclip_ViT-B-16_openai"]: the report of those alone
HEADLINE = "auto"  # evaluation giving the table's and frontier's invariance error, gap, positive rate: "auto" (multi,
#   else fliptypes, else enhanced, per model), "multi", "fliptypes", "enhanced"
TOP_K = 10  # int >= 0: rows in each top list; 0 = no lists (score files not read)
TOP_K_PER_MODEL = False  # True: the markdown lists the top K of each model;
#   False: the top K over all models (the page has both)
SCORE_SOURCES = None  # evaluations whose score files feed the top lists: None = all found,
#   or a list of "multi", "fliptypes", "enhanced"
LABELS = {}  # dict model tag -> its label in the figures and tables; unlisted tags are shortened automatically
MAX_TEXT_CHARS = 90  # int: captions longer than this are cut with "…" in the markdown top lists; 0 = never
DPI = 150  # int: resolution of the PNGs (dots per inch; the frontier is 8 x 6 inches)
IMAGE_ROOT = None  # folder the score files' image paths are relative to, for the page's thumbnails;
#   None = the one each evaluation used (its IMAGE_ROOT, else its JSONL's folder), then the metrics' folder
THUMB_PX = 200  # int > 0: the page's thumbnails fit in THUMB_PX x THUMB_PX pixels (JPEG inside the page)
BOOTSTRAP = 1000  # int >= 0: resamples of the models for the 95% intervals of the factors' rank correlations
#   (<stem>__LGIP_factors.metrics.json); 0 = none
BOOTSTRAP_SEED = 0  # int: seed of those resamples
_OWN_RULES = ("MODELS",)  # (checked here: names or patterns of the metrics' models, not the shared rule's specs)
VERBOSE = True  # True: every line (paths written, comparisons, notes); False: the result lines (run_all's default)
CONFIG = common.configure(globals())
# (after CONFIG: not settings)
from lgip.report import (  # noqa: E402
    FACTOR_FIGURES,
    FRONTIER_FIGURES,
    HEADLINE_KEYS,
    IMAGE_SIDE_FIGURES,
    PRIOR_FIGURES,
    RETRIEVAL_FIGURES,
    SCORE_KEYS,
)

OUTPUTS = (
    "report.html",
    "report.md",
    "report.csv",
    "frontier.png",
    "prior.png",
    "fliptypes.png",
    "retrieval.png",
    "image_side.png",
    "factors.metrics.json",
    "factors.png",
    "finetune.png",
    "classification_er.metrics.json",
    "classification_reliability.png",
    "classification_er.png",
    "classification_tradeoff.png",
)
NOT_WRITTEN = {
    "frontier.png": "no headline metrics",
    "prior.png": "no text-prior controls in the metrics",
    "fliptypes.png": "no per-type metrics",
    "retrieval.png": "no run_lgip_retrieval.py metrics",
    "image_side.png": "no model with both run_lgip_images.py's figures and the text side's",
    "factors.png": "fewer than two models with a parameter count (model_card) and a positive rate",
    "finetune.png": "no fine-tuned arm with a train log among the models",
    "classification_er.metrics.json": "no shift set in run_lgip_classification.py's metrics",
    "classification_reliability.png": "no per-image classification file of a model with an id set",
    "classification_er.png": "no shift set classified by 3 models or more",
    "classification_tradeoff.png": "no fine-tuned arm with both the id set's accuracy and the held-out positive rate",
}


def chosen_tag():
    """'' for a report of every model; else MODELS made file-safe, so that a report of some models
    never replaces the report of all (e.g. 'epoch-_' for ['epoch*'])."""
    import re

    patterns = model_patterns()
    return "" if patterns is None else re.sub(r"[^A-Za-z0-9._-]", "-", "+".join(patterns))[:80] + "_"


def check_config(config):
    """Each constant a value report.py can use, else ConfigError naming it, what it must be and
    what it got: before any input is read or output written."""
    for name, low in (("TOP_K", 0), ("MAX_TEXT_CHARS", 0), ("THUMB_PX", 1), ("BOOTSTRAP", 0)):
        common.require_int(config, name, low)
    if not (isinstance(config["BOOTSTRAP_SEED"], int) and not isinstance(config["BOOTSTRAP_SEED"], bool)):
        raise common.ConfigError(f"BOOTSTRAP_SEED must be an int, got {config['BOOTSTRAP_SEED']!r}")
    dpi = config["DPI"]
    if not (isinstance(dpi, int) and not isinstance(dpi, bool) and 10 <= dpi <= 1000):
        raise common.ConfigError(f"DPI must be an int from 10 to 1000 (dots per inch), got {config['DPI']!r}")
    if not isinstance(config["TOP_K_PER_MODEL"], bool):
        raise common.ConfigError(f"TOP_K_PER_MODEL must be True or False, got {config['TOP_K_PER_MODEL']!r}")
    labels = config["LABELS"]
    if not (
        isinstance(labels, dict) and all(isinstance(k, str) and isinstance(v, str) and v for k, v in labels.items())
    ):
        raise common.ConfigError(
            f"LABELS must be a dict of model tag -> label, both strings (e.g. "
            f"{{'tiny_siglip': 'SigLIP (tiny)'}}), got {labels!r}"
        )
    if config["HEADLINE"] not in ("auto", *HEADLINE_KEYS):
        raise common.ConfigError(
            f"HEADLINE must be one of {', '.join(map(repr, ('auto', *HEADLINE_KEYS)))}, got {config['HEADLINE']!r}"
        )
    sources = config["SCORE_SOURCES"]
    if sources is not None and not (isinstance(sources, (list, tuple)) and set(sources) <= set(SCORE_KEYS)):
        raise common.ConfigError(
            f"SCORE_SOURCES must be None or a list of {', '.join(map(repr, SCORE_KEYS))}, got {sources!r}"
        )
    models = config["MODELS"]
    if not (
        models is None
        or (isinstance(models, str) and models.strip(",").strip())
        or (isinstance(models, (list, tuple)) and models and all(isinstance(m, str) and m for m in models))
    ):
        raise common.ConfigError(
            f'MODELS must be None, a list of model names or patterns, or one string "a,b", got {models!r}'
        )
    for name, may_be_none in (("JSONL_PATH", False), ("OUTPUT_PREFIX", True), ("IMAGE_ROOT", True)):
        value = config[name]
        if not ((value is None and may_be_none) or (isinstance(value, str) and value)):
            raise common.ConfigError(f"{name} must be a path{' or None' if may_be_none else ''}, got {value!r}")


def find_inputs():
    """{evaluation: metrics path} and {evaluation: its per-model metrics, checked}, or a clear error.
    (The paired comparisons beside them are read by `comparisons`.)"""
    found, looked = find_metrics(JSONL_PATH)
    if not set(found) & set(HEADLINE_KEYS):  # explain_flips.py's figures alone are no report
        raise common.InputError(
            f"no LGIP metrics found for {JSONL_PATH}; looked for:\n  "
            + "\n  ".join(looked)
            + "\n(run run_lgip_multi.py, run_lgip_by_fliptype.py or "
            "rebuttal_enhanced_lgip_by_transformation.py first)"
        )
    metrics = {k: load_metrics(p, k) for k, p in found.items()}
    chosen = chosen_models(metrics)
    return found, {k: [m for m in rows if m["model_tag"] in chosen] for k, rows in metrics.items()}


def model_patterns():
    """MODELS as a list of names or patterns (None: every model)."""
    return [p.strip() for p in MODELS.split(",") if p.strip()] if isinstance(MODELS, str) else MODELS


def chosen_models(metrics):
    """The model tags the report is about: every one, or those MODELS names or matches (fnmatch,
    case-sensitive); a name or pattern that matches none is an error naming the models there are."""
    import fnmatch

    tags = list(dict.fromkeys(m["model_tag"] for rows in metrics.values() for m in rows))
    patterns = model_patterns()
    if patterns is None:
        return set(tags)
    unmatched = [p for p in patterns if not fnmatch.filter(tags, p)]
    if unmatched:
        raise common.ConfigError(
            f"MODELS: {', '.join(map(repr, unmatched))} matches no model of the metrics; "
            f"their models: {', '.join(tags)}"
        )
    return {t for t in tags if any(fnmatch.fnmatchcase(t, p) for p in patterns)}


def chosen_classified():
    """Which classified models the report is about: None (all), or a test of a tag against MODELS' patterns."""
    import fnmatch

    patterns = model_patterns()
    return None if patterns is None else (lambda tag: any(fnmatch.fnmatchcase(tag, p) for p in patterns))


def comparisons(found, chosen):
    """The paired model comparisons beside the metrics found, each file checked (a missing one is
    fine: an earlier run, or models evaluated apart), of two `chosen` models."""
    files, _ = comparison_files(found)
    rows = [c for key, path in files for c in load_comparisons(path, key)]
    return [c for c in rows if c["a"] in chosen and c["b"] in chosen]


def provenance():
    prov = common.provenance(__file__, CONFIG)
    for package in ("matplotlib", "jinja2"):
        try:
            from importlib import metadata

            prov["versions"][package] = metadata.version(package)
        except Exception:  # the version is only informative
            pass
    return prov


def main():
    check_config(CONFIG)
    found, metrics = find_inputs()
    rows = build_rows(metrics, HEADLINE, LABELS, found)
    types = report_types(metrics)  # (LGIP's three flip types, or an imported benchmark's own, in its order)
    bench = benchmark_source(JSONL_PATH, metrics, types)
    extra = add_benchmark_means(rows) if bench else []  # (its mean over the types, as the benchmark reports it)
    chosen = {m["model_tag"] for rows_ in metrics.values() for m in rows_}
    prefix = OUTPUT_PREFIX or common.metrics_path(JSONL_PATH, "LGIP_" + chosen_tag())
    out = {name: prefix + name for name in OUTPUTS}
    report = Report(
        JSONL_PATH,
        rows,
        metrics,
        found,
        provenance(),
        top_k_per_model=TOP_K_PER_MODEL,
        max_text_chars=MAX_TEXT_CHARS,
        comparisons=comparisons(found, chosen),
        benchmark=bench,
        blind=load_blind(blind_file(JSONL_PATH)),  # (blind_audit.py's, when it ran: LGIP_SPEC.md 15)
        finetune=load_finetune(metrics, [r["model"] for r in rows]),  # (finetune_lgip.py's arms: LGIP_SPEC.md 14)
        # (run_lgip_classification.py's, when it ran on this file: LGIP_SPEC.md 16)
        classification=load_classification(classification_file(JSONL_PATH), chosen_classified()),
    )
    report.effective_robustness = effective_robustness_all(report.classification)
    if report.blind is not None:  # (and the models on the debiased flips, when run_all's DEBIAS evaluated them)
        report.blind["debiased"] = load_debiased(JSONL_PATH, metrics.get("fliptypes"), chosen)
    # what predicts robustness, across the models (LGIP_SPEC.md 12): their cards against their figures
    found_factors = compute_factors(rows, metrics, report.comparisons, BOOTSTRAP, BOOTSTRAP_SEED)
    factors_file = dict({"input": os.path.abspath(JSONL_PATH)}, **found_factors, run=report.prov)
    report.factors = dict(found_factors, file=out["factors.metrics.json"])

    # every input read and checked before any output is written. The score files can be large:
    # streamed once, keeping the top TOP_K per model and over all models
    if TOP_K > 0:
        files, report.missing = score_files(metrics, found, SCORE_SOURCES, SCORE_KEYS)
        report.tops = scan_scores(files, TOP_K)
        image_files, image_missing = image_score_files(metrics, found)  # (the image side's: run_lgip_images.py)
        report.altered = scan_altered(image_files, TOP_K) if "images" in metrics else None
        report.missing += image_missing
    # the page's galleries show each listed pair's image, read where the evaluation read it, and
    # the words of each flip that explain_flips.py explained for its model, with their scores
    explained, report.explain_missing = explain_files(metrics, found)
    gallery = None
    if report.tops is not None:
        labels, roots = {r["model"]: r["label"] for r in rows}, image_roots(metrics, found, IMAGE_ROOT)
        gallery = gallery_items(report.tops, roots, labels, THUMB_PX)
        attach_attributions(gallery["flips"], explained)
        if report.altered is not None:  # (each altered image remade from its score line, beside its original)
            gallery["altered"] = altered_items(report.altered, roots, labels, seeds(metrics), THUMB_PX)

    # the outputs as one set: each to a temp file, all renamed into place at the end (a failure
    # before that leaves the previous report whole). The figures and the CSV first: the markdown
    # links them, the page embeds them
    with OutputSet() as written:
        report.front = plot_frontier(
            rows, out["frontier.png"], subtitle(report.stem, rows, "headline_source", FRONTIER_FIGURES), DPI, written
        )
        prior_png = plot_prior(
            rows, out["prior.png"], subtitle(report.stem, rows, "headline_source", PRIOR_FIGURES), DPI, written
        )
        flip_png = plot_fliptypes(
            rows,
            out["fliptypes.png"],
            subtitle(report.stem, rows, "flip_type_source", fliptype_figures(rows)),
            DPI,
            written,
            bench,
        )
        retrieval_png = plot_retrieval(
            rows, out["retrieval.png"], subtitle(report.stem, rows, "headline_source", RETRIEVAL_FIGURES), DPI, written
        )
        report.image_side_png = plot_image_side(
            rows,
            out["image_side.png"],
            subtitle(report.stem, rows, "headline_source", IMAGE_SIDE_FIGURES, also=("images",)),
            DPI,
            written,
        )
        report.factors_png = plot_factors(
            rows,
            out["factors.png"],
            found_factors,
            subtitle(report.stem, rows, "headline_source", FACTOR_FIGURES),
            DPI,
            written,
        )
        report.finetune_png = plot_finetune(
            report.finetune, out["finetune.png"], [r["model"] for r in rows], report.stem, DPI, written
        )
        tags = [r["model"] for r in rows]
        tags += [r["model"] for r in (report.classification or {}).get("rows", []) if r["model"] not in tags]
        labels = {r["model"]: r["label"] for r in rows}
        report.classification_pngs = {
            "reliability": plot_reliability(
                report.classification, out["classification_reliability.png"], tags, report.stem, DPI, written, labels
            ),
            "er": plot_er(
                report.classification,
                report.effective_robustness,
                out["classification_er.png"],
                tags,
                report.stem,
                DPI,
                written,
                labels,
            ),
            "tradeoff": plot_tradeoff(
                report.classification,
                rows,
                report.finetune,
                out["classification_tradeoff.png"],
                tags,
                report.stem,
                DPI,
                written,
            ),
        }
        er_file = out["classification_er.metrics.json"] if report.effective_robustness else None
        if er_file:  # (section 16's file: {shift set: {slope, intercept, models, effective_robustness} or null})
            common.write_json(er_file, report.effective_robustness, files=written)
        pngs = {
            "frontier.png": out["frontier.png"] if report.front is not None else None,
            "prior.png": prior_png,
            "fliptypes.png": flip_png,
            "retrieval.png": retrieval_png,
            "image_side.png": report.image_side_png,
            "factors.png": report.factors_png,
            "finetune.png": report.finetune_png,
            "classification_er.metrics.json": er_file,
            **{f"classification_{k}.png": v for k, v in report.classification_pngs.items()},
        }
        write_factors(out["factors.metrics.json"], factors_file, written)
        for name, alt in (
            ("frontier.png", "Invariance error against positive rate"),
            (
                "prior.png",
                "Positive rate against prior positive rate (the same flips with any image: "
                "the average other image); on the diagonal, all of it is text prior",
            ),
            (
                "fliptypes.png",
                "Positive rate by flip type"
                if not bench
                else f"{bench['name']}'s accuracy by type (the positive rate)"
                if bench["accuracy"]
                else f"{bench['name']}: the positive rate by type",
            ),
            ("retrieval.png", "LGIP positive rate against retrieval recall and the flip top-1 rate"),
        ):
            if pngs[name]:
                report.figures.append((pngs[name], alt))
        write_csv(out["report.csv"], rows, csv_columns(found, types, extra), written)
        write_markdown(out["report.md"], report, written)
        context = page_context(
            report, gallery, model_colors_hex([r["model"] for r in rows]), out["report.csv"], written
        )
        write_page(out["report.html"], render_page(context), written)

    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="replace")  # the table has arrows and dashes
    demo = demo_note(metrics)
    # (the headline columns: the full table is in the .md and the page)
    if demo:  # (run_all says it once, at its end)
        common.detail("**" + demo.replace("`", "") + "**\n")
    print(console_table(rows))
    print()
    random = random_init_note(metrics)  # (a model without its weights: said on every output)
    for note in ([random] if random else []) + unmeasured_notes(rows, found):
        print(common.fit("note: " + note.replace("`", "")))
    for name in OUTPUTS[1:]:
        if name in pngs and pngs[name] is None:
            earlier = "; the one there is from an earlier run" if os.path.exists(out[name]) else ""
            common.detail(f"({NOT_WRITTEN[name]}: {os.path.basename(out[name])} not written{earlier})")
        else:
            common.detail(f"-> {out[name]}")
    unreadable = len({i["path"] for items in (gallery or {}).values() for i in items if "error" in i["thumb"]})
    common.detail(
        f"-> {out['report.html']} ({os.path.getsize(out['report.html']) / 1e6:.2f} MB"
        + (
            f"; {unreadable} gallery image{'' if unreadable == 1 else 's'} missing or unreadable, shown as placeholders"
            if unreadable
            else ""
        )
        + "): open it in a browser"
    )
    return {name: path for name, path in out.items() if name not in pngs or pngs[name] is not None}


def run(**constants):
    """The command line's run, and a call from Python: the constants as keyword arguments (lgip.entry); returns
    {output name: path}. Bad input or settings say that no output was written (all are checked first)."""
    with common.script_call(globals(), constants):
        try:
            return main()
        except (common.InputError, common.ConfigError) as e:
            raise type(e)(f"{e}\n  no output was written (the previous report, if any, is as it was)") from None


if __name__ == "__main__":
    common.run_main(run)
