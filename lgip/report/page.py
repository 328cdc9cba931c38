"""lgip.report.page: the report as one self-contained web page (`<stem>__LGIP_report.html`),
rendered with Jinja2 from templates/page.html.j2 (its CSS and script inlined from page.css and
page.js beside it). Nothing is fetched: figures and thumbnails are `data:` URIs, so the file
opens by double-click from any folder.

What the template gets (`page_context`): the overview (inputs, evaluations, versions, notes,
provenance), the results table as rows of cells that carry the value they sort by, the figures,
the fine-tuned arms beside their start (their table, comparisons and loss curves), the
text-prior controls' lines and the paired comparisons, the image side's lines and figure, the word
attribution's lines, and the gallery items (lgip.report.gallery; a flip's words with their scores when
explain_flips.py explained it; the altered images a model prefers, lgip.report.image_side). A later
column, figure or item field shows once it is in these; the template is the one place that decides how.

    >>> html = render_page(page_context(report, gallery_items(report.tops, roots, labels)))
    >>> write_page("x__LGIP_report.html", html)
"""

import base64
import os
import re

from ..method import FLIP_TYPES
from ..outputs import atomic_open
from .overview import (
    SINGLE_MODEL_NOTE,
    demo_note,
    frontier_note,
    made_by,
    missing_note,
    random_init_note,
    retrieval_note,
    runs_table,
    source_notes,
    sources_table,
)
from .attribution_text import attribution_lines, word_scores_note
from .controls_text import COMPARISONS_LEAD, comparison_rows, comparison_text, comparisons_notes, prior_lines
from .benchmark_text import benchmark_lines
from .blind_text import blind_lines
from .factors_text import factor_lines
from .finetune_text import finetune_lines
from .classification_text import classification_lines
from .image_side import KIND_NAMES, image_side_lines
from .tables import IN_SCORE_UNITS, interval, num, result_columns, row_types
from .rows import mixed_kinds
from .markdown import CLASSIFICATION_FIGURES, CONSOLE_COLUMNS
from .seen_text import seen_lines, seen_mark

TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
# a score kind (LGIP_SPEC.md 13) -> (the gallery's column label, what the score is, its formula's name)
SCORE_LABELS = {
    "cosine": ("sim", "cosine similarity with the image", "sim"),
    "logprob": ("log p", "log-probability of the text given the image (summed over its tokens)", "log p"),
    "logprob_mean": ("log p / token", "mean log-probability of the text's tokens given the image", "log p"),
    "vqascore": ("log p(Yes)", "log-probability of the answer Yes to whether the image shows the text", "log p(Yes)"),
    "itm_logodds": ("ITM", "log-odds of a match by the image-text matching head", "itm"),
}
COMPARING_FIGURES = ("retrieval.png",)  # (figures across models alone: left off a one-model page)


def inline_markdown(text):
    """Markdown inline text as HTML: escaped, `code` as <code> that may break after _ . / (long
    file names wrap at their parts), **bold** as <strong>."""
    from markupsafe import Markup, escape

    def code(m):
        return "<code>" + re.sub(r"([_./])", r"\1<wbr>", m.group(1)) + "</code>"

    html = re.sub(r"`([^`]+)`", code, str(escape(text)))
    return Markup(re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", html))


def data_uri(path, mime):
    with open(path, "rb") as f:
        return f"data:{mime};base64," + base64.b64encode(f.read()).decode("ascii")


def figure_size(png):
    """{"width": CSS pixels at 100 dots per inch of the figure, "basis": the width it may shrink to
    beside another}: a wide figure (many models) takes a row of its own, two small ones share one."""
    from PIL import Image

    with Image.open(png) as img:
        dpi = (img.info.get("dpi") or (100, 100))[0] or 100
        width = round(img.width * 100 / dpi)
    return {"width": width, "basis": round(width * 0.75)}


# the results table's headline columns, shown first (the console's, and Inv. rel.); the others are one click away
HEADLINE = CONSOLE_COLUMNS + ("Inv. rel. ↓",)


def results_table(rows):
    """(header cells, body rows) of the page's results table: every cell has `text`, the `value`
    it sorts by (None sorts last), and for figures its interval and whether it is the column's best;
    `more`: a column beyond the headline ones (HEADLINE), shown on a click."""
    spec = result_columns(rows)
    header = [
        {"text": "Model", "numeric": False, "better": "", "title": "model (hover a name for its tag)", "more": False},
        {"text": "Records", "numeric": True, "better": "", "title": "records evaluated", "more": False},
    ] + [
        {
            "text": c.header.replace(" ↑", "\u00a0↑").replace(" ↓", "\u00a0↓"),
            "numeric": True,
            "better": c.better,
            "title": c.title or f"{c.name}: {c.better}er is better",
            "more": c.header not in HEADLINE,
        }
        for c in spec
    ]
    best = {}
    mixed = mixed_kinds(rows)  # (several score kinds: a column in score units has no best model)
    for c in spec:  # (a control's column has none)
        values = [r[c.name] for r in rows if r.get(c.name) is not None]
        best[c.name] = (
            (min if c.better == "low" else max)(values)
            if len(values) > 1 and c.better and not (mixed and c.name in IN_SCORE_UNITS)
            else None
        )
    body = []
    for r in rows:
        source = (
            f" · headline figures from {r['headline_file']}"
            + (f" (made {r['headline_created']})" if r.get("headline_created") else "")
            if r.get("headline_file")
            else ""
        )
        cells = [
            {"text": r["label"], "value": r["label"], "title": r["model"] + source, "seen": seen_mark(r)},
            {"text": num(r["num_records"], 0), "value": r["num_records"], "ci": "", "best": False},
        ]
        for c in spec:
            v = r.get(c.name)
            cells.append(
                {
                    "text": num(v, c.digits),
                    "value": v,
                    "ci": interval(r, c.name, c.digits),
                    "best": v is not None and v == best[c.name],
                }
            )
        body.append({"model": r["model"], "cells": cells})
    return header, body


def comparisons_context(report):
    """The paired comparisons for the template: {"lead", "overall", "by_type", "notes"}, each row with
    its last column's text (`says`)."""
    table = comparison_rows(report.comparisons, report.rows)
    for c in table["overall"] + table["by_type"]:
        c["says"] = comparison_text(c)
    return dict(table, lead=COMPARISONS_LEAD, notes=comparisons_notes(table, report.comparisons, report.rows))


def share_thumbnails(gallery):
    """Each distinct thumbnail once in the page: the first card showing it carries it (`id`), every
    other card names that one (`same`: page.js gives it the same source when the page loads). A
    record's image shows in several galleries and lists (its flips, its paraphrases, its altered
    images): nine models' page, 4.6 -> 3.9 MB. Returns the number of thumbnails shared."""
    seen, shared = {}, 0

    def one(t):
        nonlocal shared
        if "src" not in t:  # (a placeholder: small, kept as it is)
            return t
        if t["src"] not in seen:
            seen[t["src"]] = dict(t, id=f"thumb{len(seen)}")
            return seen[t["src"]]
        shared += 1
        return {"same": seen[t["src"]]["id"], "width": t["width"], "height": t["height"]}

    for it in [i for key in ("flips", "paraphrases", "altered") for i in (gallery or {}).get(key, ())]:
        it["thumb"] = one(it["thumb"])
        if "altered_thumb" in it:
            it["altered_thumb"] = one(it["altered_thumb"])
    return shared


def page_context(report, gallery=None, colors=None, csv_path=None, files=None):
    """The template's variables. gallery: lgip.report.gallery.gallery_items (None: no lists);
    colors: model tag -> '#rrggbb' as in the figures; csv_path: the CSV, offered as a download;
    files: the lgip.outputs.OutputSet the figures and the CSV were written to (read before its commit)."""
    staged = files.staged if files else (lambda path: path)
    share_thumbnails(gallery)
    header, cells, versions = runs_table(report.metrics, report.paths)
    table_header, table_rows = results_table(report.rows)
    colors = colors or {}
    attributed = sum("attribution" in i for i in gallery["flips"]) if gallery else 0
    models = [{"tag": r["model"], "label": r["label"], "color": colors.get(r["model"], "#777")} for r in report.rows]
    # one model: what compares models means nothing (a rank correlation over one point, a frontier of
    # one) and is left out of the page, which says so once; the markdown keeps its full text
    several = len(report.rows) > 1
    figures = [
        dict(figure_size(staged(png)), src=data_uri(staged(png), "image/png"), alt=alt, name=os.path.basename(png))
        for png, alt in report.figures
        if several or not png.endswith(COMPARING_FIGURES)
    ]

    def embedded(png):  # a figure shown in its own section (None: not written)
        return (
            dict(figure_size(staged(png)), src=data_uri(staged(png), "image/png"), name=os.path.basename(png))
            if png
            else None
        )

    return {
        "stem": report.stem,
        "demo": demo_note(report.metrics),
        "random_init": random_init_note(report.metrics),
        "seen": seen_lines(report.rows),  # (models that may have seen the probed images in training: None when none)
        "single": None if several else SINGLE_MODEL_NOTE,
        "input": os.path.abspath(report.jsonl_path),
        "models": models,
        "color": {m["tag"]: m["color"] for m in models},
        # each model's score label (its kind's: a log-probability is not called a similarity)
        "score": {
            r["model"]: dict(
                zip(("short", "long", "fn"), SCORE_LABELS.get(r.get("score_kind"), SCORE_LABELS["cosine"]))
            )
            for r in report.rows
        },
        "protocols": report.protocols,
        "runs": {"header": header, "cells": cells},
        "versions": versions,
        "table": {"header": table_header, "rows": table_rows},
        "benchmark": benchmark_lines(report.rows, report.benchmark, report.paths),  # None for LGIP's own data
        "notes": source_notes(report.rows, report.metrics, report.paths),
        "sources": dict(
            zip(("header", "cells"), sources_table(report.rows))
        ),  # per model: its figures' files, when made
        "frontier": frontier_note(report.front, report.rows) if report.front and several else None,
        "retrieval": retrieval_note(report.rows) if several else None,
        "figures": figures,
        "top_k": report.tops.k if report.tops is not None else 0,
        # (models of several score kinds: the list over all models takes each model's top in turn, lgip.report.toplists)
        "all_scope": " over all models, each model's in turn (their scores differ in kind)"
        if mixed_kinds(report.rows)
        else " over all models",
        "blind": blind_lines(report.blind),  # None without blind_audit.py's metrics (LGIP_SPEC.md 15)
        # None without fine-tuned arms among the models (LGIP_SPEC.md 14)
        "finetune": finetune_lines(report.finetune, report.rows, report.comparisons, report.paths),
        "finetune_figure": embedded(report.finetune_png),
        # None without run_lgip_classification.py's metrics (LGIP_SPEC.md 16)
        "classification": classification_lines(
            report.classification,
            report.effective_robustness,
            {r["model"]: r["label"] for r in report.rows},
            report.finetune,
            [r["model"] for r in report.rows],
        ),
        "classification_figures": [
            dict(embedded(report.classification_pngs[key]), alt=alt, key=key)
            for key, alt in CLASSIFICATION_FIGURES.items()
            if report.classification_pngs.get(key)
        ],
        "prior": prior_lines(report.rows, report.paths),  # None without the text-prior controls
        "comparisons": comparisons_context(report),
        "attribution": attribution_lines(report.rows, report.metrics, report.paths, report.explain_missing),
        "factors": factor_lines(report.factors),  # what predicts robustness (None: no factors)
        "factors_figure": embedded(report.factors_png),
        "image_side": image_side_lines(report.rows, report.metrics, report.paths),  # None without run_lgip_images.py
        "image_side_figure": embedded(report.image_side_png),
        "altered_kinds": [
            (k, KIND_NAMES[k])
            for k in KIND_NAMES
            if gallery and any(i["kind"] == k for i in gallery.get("altered", ()))
        ],
        "gallery": gallery,
        "attributed": attributed,
        "word_scores": word_scores_note(report.rows, report.metrics, attributed, len(gallery["flips"]))
        if gallery
        else None,
        "flip_types": [
            t
            for t in list(dict.fromkeys(row_types(report.rows) + list(FLIP_TYPES)))
            if gallery and any(i.get("type") == t for i in gallery["flips"])
        ],
        "missing": missing_note(report.missing),
        "made_by": made_by(report.prov),
        "csv": (
            {"name": os.path.basename(csv_path), "src": data_uri(staged(csv_path), "text/csv")}
            if csv_path and os.path.isfile(staged(csv_path))
            else None
        ),
    }


def render_page(context):
    """The page's HTML from page_context's variables."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["inline"] = inline_markdown
    env.filters["signed"] = lambda v, digits=4: "–" if v is None else f"{v:+.{digits}f}".replace("-", "−")
    env.filters["fixed"] = lambda v, digits=4: "–" if v is None else f"{v:.{digits}f}".replace("-", "−")
    env.filters["score"] = lambda v: "–" if v is None else f"{v:+.3g}".replace("-", "−")
    return env.get_template("page.html.j2").render(**context)


def write_page(path, html, files=None):
    with (files.open if files else atomic_open)(path) as f:
        f.write(html)
