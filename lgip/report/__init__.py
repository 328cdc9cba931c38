"""lgip.report: the machinery of report.py, one module per concern; each imports only those above it.

  fields      one model's metrics read safely: each field checked (a rate in [0, 1], an interval), a bad
              one named by its dotted path; the figures' names, the model card's fields
  extract     one model's metrics of each evaluation as flat columns (`extract_<key>`)
  evaluations which evaluations ran on a JSONL (`EVALUATIONS`, one entry each, declaring its columns and
              per-type blocks: a new evaluation goes here), their metrics files found, read and checked,
              the CSV's columns (per flip type: LGIP's, or an imported benchmark's own types)
  rows        one flat row per model (by lookup of the columns), labels, model cards, image folders, the
              rank correlations across models
  comparisons the paired model comparisons beside the metrics, read and checked
  benchmarks  whether the input is an imported benchmark, and the means it reports
  tables     the results table's columns (`RESULT_COLUMNS`: a new column goes here), numbers as
             printed, markdown tables, the CSV
  toplists   the score files streamed into the top K paraphrase moves and preferred flips, per model
             and over all models
  factors    what predicts robustness (LGIP_SPEC.md 12): the models' cards against their figures, rank
             correlations with intervals over models, levels, controlled pairs; the factors file
  plots      the frontier, text-prior, flip-type, retrieval, image-side and factors figures (matplotlib, PNG);
             a new figure goes here
  blind_text the section "Is the probe blind-solvable?": blind_audit.py's metrics found, checked and said
             (LGIP_SPEC.md 15)
  overview   `Report` (what the markdown and the page say) and the texts around the figures; beside it
             each section's own: attribution_text, controls_text, benchmark_text, factors_text
  finetune_text the section "Fine-tuning": the fine-tuned arms among the models found (a model/ folder with
             finetune.meta.json beside it) and their WiSE-FT points (wise.meta.json), their meta and train logs
             checked, the table, the comparisons with their start, a sentence per arm (LGIP_SPEC.md 14);
             finetune_plot: their loss curves
  classification_text the section "Classification" (LGIP_SPEC.md 16): run_lgip_classification.py's metrics and
             per-image files found and checked, effective robustness, the tables, comparisons and notes;
             classification_plot: the reliability diagram, the effective-robustness scatter, the trade-off plot
  gallery    gallery items: thumbnails as data: URIs (placeholders when unreadable), words marked,
             a flip's word scores from explain_flips.py's lines
  image_side the image side (run_lgip_images.py): a line per model beside its text figures, the altered
             images a model prefers to their original, streamed from its score files and remade
  markdown   the markdown report
  page       the self-contained HTML page, rendered with Jinja2 from templates/page.html.j2

Every writer takes `files`, the lgip.outputs.OutputSet (re-exported here) that report.py writes all
its outputs through, so that they are renamed into place together or not at all.

    >>> found, looked = find_metrics("x.jsonl")
    >>> rows = build_rows({k: load_metrics(p) for k, p in found.items()})
"""

from .evaluations import (
    COLUMNS,
    EVALUATIONS,
    HEADLINE_KEYS,
    SCORE_KEYS,
    SCRIPTS,
    columns,
    csv_columns,
    find_metrics,
    load_metrics,
    report_types,
)
from .rows import build_rows, image_roots, short_label, short_labels
from .comparisons import comparison_files, load_comparisons
from .benchmarks import add_benchmark_means, benchmark_source
from .tables import RESULT_COLUMNS, result_columns_for, row_types, write_csv
from .toplists import TopK, TopLists, scan_scores, score_files
from .factors import compute_factors, write_factors
from .diagnostic_plots import IMAGE_SIDE_FIGURES, plot_factors, plot_image_side, plot_prior
from .plots import (
    FACTOR_FIGURES,
    FLIPTYPE_FIGURES,
    FRONTIER_FIGURES,
    PRIOR_FIGURES,
    RETRIEVAL_FIGURES,
    fliptype_figures,
    model_colors_hex,
    pareto_front,
    plot_fliptypes,
    plot_frontier,
    plot_retrieval,
    subtitle,
)
from .blind_text import blind_file, blind_lines, load_blind, load_debiased
from .overview import Report, demo_note, random_init_note, unmeasured_notes
from .finetune_text import finetune_lines, load_finetune
from .finetune_plot import plot_finetune
from .classification_text import classification_file, classification_lines, effective_robustness_all
from .classification_text import load_classification
from .classification_plot import plot_er, plot_reliability, plot_tradeoff
from .gallery import attach_attributions, explain_files, gallery_items, thumbnail, word_marks
from .image_side import altered_items, image_score_files, image_side_lines, scan_altered, seeds
from .markdown import console_table, results_table, write_markdown
from .page import page_context, render_page, write_page
from ..outputs import OutputSet

__all__ = [
    "COLUMNS",
    "EVALUATIONS",
    "FACTOR_FIGURES",
    "FLIPTYPE_FIGURES",
    "FRONTIER_FIGURES",
    "HEADLINE_KEYS",
    "IMAGE_SIDE_FIGURES",
    "OutputSet",
    "altered_items",
    "blind_file",
    "blind_lines",
    "finetune_lines",
    "classification_file",
    "classification_lines",
    "effective_robustness_all",
    "load_classification",
    "plot_er",
    "plot_reliability",
    "plot_tradeoff",
    "load_finetune",
    "plot_finetune",
    "load_blind",
    "load_debiased",
    "image_score_files",
    "image_side_lines",
    "plot_image_side",
    "scan_altered",
    "seeds",
    "PRIOR_FIGURES",
    "RESULT_COLUMNS",
    "RETRIEVAL_FIGURES",
    "Report",
    "SCORE_KEYS",
    "SCRIPTS",
    "TopK",
    "TopLists",
    "add_benchmark_means",
    "attach_attributions",
    "benchmark_source",
    "build_rows",
    "columns",
    "comparison_files",
    "compute_factors",
    "csv_columns",
    "demo_note",
    "explain_files",
    "find_metrics",
    "fliptype_figures",
    "gallery_items",
    "image_roots",
    "load_comparisons",
    "load_metrics",
    "model_colors_hex",
    "page_context",
    "pareto_front",
    "plot_factors",
    "plot_fliptypes",
    "plot_frontier",
    "plot_prior",
    "plot_retrieval",
    "random_init_note",
    "render_page",
    "report_types",
    "result_columns_for",
    "results_table",
    "console_table",
    "row_types",
    "scan_scores",
    "score_files",
    "short_label",
    "short_labels",
    "subtitle",
    "thumbnail",
    "unmeasured_notes",
    "word_marks",
    "write_csv",
    "write_factors",
    "write_markdown",
    "write_page",
]
