"""lgip.report.markdown: the report as markdown (`<stem>__LGIP_report.md`): inputs, the
evaluations found, the results table, notes, the file of each model's figures, the rank
correlation with retrieval (when run_lgip_retrieval.py ran), the figures (linked beside it), the fine-tuned
arms beside their start (a fine-tuning run's held-out file: lgip.report.finetune_text), the text-prior
controls' line per model and the paired comparisons (when the evaluations wrote them), the image
side (run_lgip_images.py: a line per model, its figure, the altered images preferred), the word
attribution's line per model (when explain_flips.py ran), the top lists, and what made it. Pure text
from a `Report` (lgip.report.overview).

    >>> print(results_table(report.rows))     # also what report.py prints
    | Model         | Records |            Inv. error ↓ | ...
"""

import os
import re

from ..outputs import atomic_open
from .overview import (
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
from .attribution_text import attribution_lines
from .controls_text import COMPARISONS_LEAD, comparison_rows, comparison_text, comparisons_notes, prior_lines
from .benchmark_text import benchmark_lines
from .blind_text import blind_lines
from .factors_text import factor_lines
from .finetune_text import finetune_lines
from .classification_text import classification_lines
from .image_side import image_side_lines, markdown_rows as altered_rows
from .seen_text import seen_lines
from .tables import main_table, md_table, md_text


def results_table(rows):
    return md_table(*main_table(rows))


CONSOLE_COLUMNS = (
    "Model",
    "Records",
    "Inv. error ↓",
    "Pos. rate ↑",
    "Grounded pos. ↑",
    "I2T R@1 ↑",
    "Img. inv. ↓",
    "Img. pos. ↑",
)


def console_table(rows):
    """The main table's headline columns (CONSOLE_COLUMNS, those some row has) without their intervals, to fit a
    terminal: the report's .md and page have them all."""
    from .rows import mixed_kinds

    header, cells, align = main_table(rows)
    wanted = CONSOLE_COLUMNS + (
        ("Inv. rel. ↓",) if mixed_kinds(rows) else ()
    )  # (several score kinds: what compares them)
    keep = [i for i, h in enumerate(header) if h in wanted]
    bare = lambda cell: re.sub(r" \[[^\]]*\]$", "", cell)  # (no interval: a line under ~160 characters)
    table = md_table([header[i] for i in keep], [[bare(c[i]) for i in keep] for c in cells], [align[i] for i in keep])
    return table + "\n(95% intervals in the report)" if any(bare(c[i]) != c[i] for c in cells for i in keep) else table


def _runs_summary(report):
    header, cells, versions = runs_table(report.metrics, report.paths)
    lines = [md_table(header, cells)]
    for which, v in versions:
        lines.append(
            f"\nPackage versions{f' ({which})' if which else ''}: " + ", ".join(f"{k} {val}" for k, val in v.items())
        )
    return "\n".join(lines)


def _fewer(report, rows, one, many):
    """' (only 3 flips have gap < 0)' when the list over all models is shorter than TOP_K, else ''."""
    n = len(rows)
    if report.top_k_per_model or not n or n >= report.tops.k:
        return ""
    return f" (only {n} {one if n == 1 else many})"


def prior_text(prior_gap):
    """A preferred flip's prior, in words: 'prefers it too (-0.0123)', 'prefers the caption (+0.0100)', or '–'."""
    if prior_gap is None:
        return "–"
    return f"{'prefers it too' if prior_gap <= 0 else 'prefers the caption'} ({prior_gap:+.4f})"


def _top_tables(report):
    para_top, flip_top = report.tops.for_markdown(report.top_k_per_model)
    k, limit = report.tops.k, report.max_text_chars
    parts = []
    para_rows = [(i + 1, row) for rows in para_top.values() for i, row in enumerate(rows)]  # ranked per bucket
    flip_rows = [(i + 1, row) for rows in flip_top.values() for i, row in enumerate(rows)]
    scope = "per model" if report.top_k_per_model else "over all models"
    parts.append(
        f"## Paraphrases that move the score most\n\nTop {k} paraphrases {scope} by |Δ sim|"
        + _fewer(report, para_rows, "paraphrase was scored", "paraphrases were scored")
        + ", "
        "Δ sim = sim(image, paraphrase) − sim(image, caption); an invariant model keeps it near 0.\n"
    )
    if para_rows:
        parts.append(
            md_table(
                ["#", "Model", "Image", "Caption", "Paraphrase", "Δ sim"],
                [
                    [
                        i,
                        f"`{r['model']}`",
                        r["image"],
                        md_text(r["caption"], limit),
                        md_text(r["text"], limit),
                        f"{r['delta']:+.4f}",
                    ]
                    for i, r in para_rows
                ],
                ["r", "l", "r", "l", "l", "r"],
            )
        )
    else:
        parts.append("No paraphrase scores found.")
    parts.append(
        f"\n## Flips most preferred over their original\n\nTop {k} flips {scope} with gap < 0"
        + _fewer(report, flip_rows, "flip has gap < 0", "flips have gap < 0")
        + ", "
        "gap = sim(image, caption) − sim(image, flip): the model scores the wrong caption higher.\n"
    )
    if flip_rows:
        prior = any(r.get("prior_gap") is not None for _, r in flip_rows)  # (score files with the flips' prior gaps)
        parts.append(
            md_table(
                ["#", "Model", "Image", "Caption", "Flip", "Type", "Gap", *(["Average other image"] if prior else [])],
                [
                    [
                        i,
                        f"`{r['model']}`",
                        r["image"],
                        md_text(r["caption"], limit),
                        md_text(r["text"], limit),
                        r.get("type") or "?",
                        f"{r['gap']:+.4f}",
                        *([prior_text(r.get("prior_gap"))] if prior else []),
                    ]
                    for i, r in flip_rows
                ],
                ["r", "l", "r", "l", "l", "l", "r", *(["l"] if prior else [])],
            )
        )
        if prior:
            parts.append(
                "\nAverage other image: the same flip scored against the average of the other images (prior "
                'gap, LGIP_SPEC.md section 9): "prefers it too" (prior gap ≤ 0: a text prior, the flip wins '
                'with any image) or "prefers the caption" (the model prefers the flip only on this image); '
                "–: its score file has no prior gaps (the enhanced analysis, or an evaluation from before them)."
            )
    else:
        parts.append("No flip was scored above its original.")
    return "\n".join(parts)


def comparisons_table(rows, typed=False):
    """(header, cells, align) of the paired comparisons (lgip.report.overview.comparison_rows), overall
    or by flip type."""
    header = [
        "Evaluation",
        "Figure",
        *(["Flip type"] if typed else []),
        "A",
        "B",
        "A − B [95% CI]",
        "Images",
        "Interval excludes 0?",
    ]
    cells = [
        [
            f"`{c['script']}`",
            c["figure"],
            *([c["flip_type"]] if typed else []),
            f"{c['a']['label']} ({c['a']['value']})",
            f"{c['b']['label']} ({c['b']['value']})",
            (f"{c['diff']} {c['ci']}" if c["ci"] else c["diff"]) + (" †" if c["stale"] else ""),
            "–" if c["images"] is None else str(c["images"]),
            comparison_text(c),
        ]
        for c in rows
    ]
    return header, cells, ["l", "l", *(["l"] if typed else []), "l", "l", "r", "r", "l"]


def _prior_section(report):
    """The section "Is it the image?": the line per model and the paired comparisons; [] without controls."""
    prior = prior_lines(report.rows, report.paths)
    if prior is None:
        return []
    md = ["## Is it the image? Text-prior controls", "", prior["lead"], ""] + [
        "- " + line["text"] for line in prior["lines"]
    ]
    table = comparison_rows(report.comparisons, report.rows)
    notes = comparisons_notes(table, report.comparisons, report.rows)
    if table["overall"] or table["by_type"] or notes:
        md += ["", "### Paired comparisons", ""]
        if table["overall"] or table["by_type"]:
            md += [COMPARISONS_LEAD, ""]
        if table["overall"]:
            md += [md_table(*comparisons_table(table["overall"])), ""]
        if table["by_type"]:
            md += ["By flip type:", "", md_table(*comparisons_table(table["by_type"], typed=True)), ""]
        md += [" ".join(notes)] if notes else []
    return md + [""]


def bench_md_table(t):
    """(header, cells, align) of one of an imported benchmark's tables (lgip.report.overview.benchmark_lines)."""
    header = ["Model"] + [
        f"{h['sub']} {h['text']}" if t["groups"] else h["text"] + (f" ({h['sub']})" if h["sub"] else "")
        for h in t["header"]
    ]
    cells = [[r["label"]] + [c["text"] + (f" {c['ci']}" if c["ci"] else "") for c in r["cells"]] for r in t["rows"]]
    return header, cells, ["l"] + ["r"] * (len(header) - 1)


def _benchmark_section(report):
    """The section "<Benchmark> table" of an imported benchmark; [] for LGIP's own data."""
    bench = benchmark_lines(report.rows, report.benchmark, report.paths)
    if bench is None:
        return []
    md = [f"## {bench['title']}", "", bench["lead"], ""]
    for t in bench["tables"]:
        md += [f"{t['caption']}:", "", md_table(*bench_md_table(t)), ""]
    return md + ([" ".join(bench["notes"]), ""] if bench["notes"] else [])


def _blind_section(report):
    """The section "Is the probe blind-solvable?" (LGIP_SPEC.md 15); [] without blind_audit.py's metrics."""
    blind = blind_lines(report.blind)
    if blind is None:
        return []
    cells = [[r["label"]] + [c["text"] + (f" {c['ci']}" if c["ci"] else "") for c in r["cells"]] for r in blind["rows"]]
    align = ["l"] + ["r"] * (len(blind["header"]) - 1)
    return (
        [f"## {blind['title']}", "", blind["lead"], "", md_table(blind["header"], cells, align), ""]
        + ["- " + s for s in blind["sentences"]]
        + ["", f"From `{blind['path']}`.", ""]
        + _debiased_lines(blind["debiased"])
    )


def _finetune_section(report, md_dir):
    """The section "Fine-tuning" (LGIP_SPEC.md 14): the start and its arms, their comparisons, a sentence per
    arm, the loss curves; [] when no model is a fine-tuned arm."""
    ft = finetune_lines(report.finetune, report.rows, report.comparisons, report.paths)
    if ft is None:
        return []
    join = lambda c: c["text"] + (f" {c['ci']}" if c["ci"] else "")
    cells = [[f"`{r['model']}`{r['note']}"] + [join(c) for c in r["cells"]] for r in ft["rows"]]
    md = [f"## {ft['title']}", "", ft["lead"], "", md_table(ft["header"], cells, ["l"] + ["r"] * len(cells[0][1:]))]
    md += ["", ft["held_out"], ""]
    if ft["comparisons"]["rows"]:
        comp = ft["comparisons"]
        body = [
            [f"`{r['a']}` − `{r['b']}`", f"{r['figure']} ({r['better']} is better)"]
            + [f"**{join(c)}**" if c["excludes"] else join(c) for c in r["cells"]]
            for r in comp["rows"]
        ]
        md += [ft["comparisons_lead"], "", md_table(comp["header"], body, ["l", "l"] + ["r"] * len(body[0][2:])), ""]
    md += ["- " + s["text"] for s in ft["sentences"]] + ([""] if ft["sentences"] else [])
    if report.finetune_png:
        rel = os.path.relpath(os.path.abspath(report.finetune_png), md_dir)
        md += [f"![Training losses of each arm against the step, on the train images]({rel})", ""]
    return md + ([" ".join(ft["notes"]), ""] if ft["notes"] else [])


CLASSIFICATION_FIGURES = {
    "reliability": "Reliability on the id set: accuracy against confidence per bin, at T = 1 and T*",
    "er": "Accuracy under shift against in-distribution on probit axes, and the fit (effective robustness)",
    "tradeoff": "The id set's accuracy against the held-out positive rate: the start, each arm and its WiSE-FT points",
}


def _classification_section(report, md_dir):
    """The section "Classification" (LGIP_SPEC.md 16): a table per dataset, OOD detection, effective robustness,
    each model against its start, the figures; [] when run_lgip_classification.py did not run."""
    labels = {r["model"]: r["label"] for r in report.rows}
    c = classification_lines(
        report.classification, report.effective_robustness, labels, report.finetune, [r["model"] for r in report.rows]
    )
    if c is None:
        return []
    join = lambda x: x["text"] + (f" {x['ci']}" if x["ci"] else "")
    md = [f"## {c['title']}", "", c["lead"], ""]
    for t in c["tables"]:
        cells = [[f"`{r['model']}`"] + [join(x) for x in r["cells"]] for r in t["rows"]]
        md += [f"{t['caption']}:", "", md_table(t["header"], cells, ["l"] + ["r"] * (len(t["header"]) - 1)), ""]
    md += ["- " + line for line in c["er"]] + ([""] if c["er"] else [])
    if c["ood"]:
        cells = [[f"`{r['model']}`"] + [join(x) for x in r["cells"]] for r in c["ood"]["rows"]]
        md += [c["ood"]["lead"], "", md_table(c["ood"]["header"], cells, ["l"] + ["r"] * len(cells[0][1:])), ""]
    if c["comparisons"]["rows"]:
        body = [
            [f"`{r['a']}` − `{r['b']}`", f"`{r['set']}`", f"{r['figure']} ({r['better']} is better)"]
            + [f"**{join(r['cell'])}**" if r["cell"]["excludes"] else join(r["cell"])]
            for r in c["comparisons"]["rows"]
        ]
        md += [c["comparisons_lead"], "", md_table(c["comparisons"]["header"], body, ["l", "l", "l", "r"]), ""]
    md += ["- " + s["text"] for s in c["sentences"]] + ([""] if c["sentences"] else [])
    for key, alt in CLASSIFICATION_FIGURES.items():
        png = report.classification_pngs.get(key)
        if png:
            md += [f"![{alt}]({os.path.relpath(os.path.abspath(png), md_dir)})", ""]
    return md + [" ".join(c["notes"]), ""]


def _debiased_lines(side):
    """The models' positive rates on all flips and on the debiased ones (run_all's DEBIAS); [] without them."""
    if side is None:
        return []
    cells = [[r["model"]] + [c["text"] + (f" {c['ci']}" if c["ci"] else "") for c in r["cells"]] for r in side["rows"]]
    align = ["l"] + ["r"] * (len(side["header"]) - 1)
    return ["### On the debiased flips", "", side["lead"], "", md_table(side["header"], cells, align), ""]


def factor_md_tables(f):
    """(the factor table, the controlled pairs' table) of factor_lines' dict, each (header, cells, align);
    a cell its figure and, after it, its interval and counts."""

    def cell(c):
        return c["text"] + (f" ({c['sub']})" if c["sub"] else "")

    cells = []
    for g in f["groups"]:
        cells.append([f"**{g['title']}**"] + [""] * len(f["header"]))
        cells += [[r["label"]] + [cell(c) for c in r["cells"]] for r in g["rows"]]
    factor = (["Factor"] + f["header"], cells, ["l"] + ["r"] * len(f["header"]))
    pairs = (
        f["pairs"]["header"],
        [[f"`{p['a']}`", f"`{p['b']}`", p["why"]] + [cell(c) for c in p["cells"]] for p in f["pairs"]["rows"]],
        ["l", "l", "l"] + ["r"] * len(f["header"]),
    )
    return factor, pairs


def _factors_section(report, md_dir):
    """The section "What predicts robustness": the factor table, the figure, the controlled pairs."""
    f = factor_lines(report.factors)
    if f is None:
        return []
    factor, pairs = factor_md_tables(f)
    md = ["## What predicts robustness", "", f["lead"], "", md_table(*factor), ""]
    if report.factors_png:
        md += [
            f"![Positive rate and grounded positive rate against parameters, by training data]"
            f"({os.path.relpath(os.path.abspath(report.factors_png), md_dir)})",
            "",
        ]
    if pairs[1]:
        md += [
            "Controlled pairs (A − B, [95% interval over images] from the paired comparisons):",
            "",
            md_table(*pairs),
            "",
        ]
    return md + ([" ".join(f["notes"]), ""] if f["notes"] else [])


def _image_side_section(report, md_dir):
    """The section "The image side": a line per model, the figure, the altered images preferred over all models."""
    image = image_side_lines(report.rows, report.metrics, report.paths)
    if image is None:
        return []
    md = ["## The image side: does the score follow the image?", "", image["lead"], ""]
    md += ["- " + line["text"] for line in image["lines"]] + [""]
    if report.image_side_png:
        md += [
            f"![Image invariance error against text invariance error; image positive rate against text positive rate]"
            f"({os.path.relpath(os.path.abspath(report.image_side_png), md_dir)})",
            "",
        ]
    md += [" ".join(image["notes"]), ""]
    if report.altered is not None:
        header, cells, align = altered_rows(report.altered, report.max_text_chars)
        k = report.altered.k
        md += [
            f"Altered images preferred to their original: the top {k} over all models"
            + (f" (only {len(cells)})" if len(cells) < k else "")
            + ", by the most negative image gap = sim(image, "
            "caption) − sim(altered image, caption) of its record's captions "
            "(the page shows each beside its original).",
            "",
        ]
        md += [md_table(header, cells, align) if cells else "No altered image was scored above its original.", ""]
    return md


def markdown(report, md_path):
    """The markdown text; figures are linked relative to md_path's folder."""
    rows = report.rows
    md_dir = os.path.dirname(os.path.abspath(md_path))
    demo = demo_note(report.metrics)
    random = random_init_note(report.metrics)
    seen = seen_lines(rows)  # (models that may have seen the probed images in training, beside the figures)
    md = [
        f"# LGIP report: {report.stem}",
        "",
        *([f"**{demo}**", ""] if demo else []),
        *([f"**{random}**", ""] if random else []),
        f"Input: `{os.path.abspath(report.jsonl_path)}`  ",
        "Models: " + ", ".join(f"`{r['model']}`" for r in rows) + "  ",
        "Protocol: " + ", ".join(report.protocols),
        "",
        _runs_summary(report),
        "",
        "## Results",
        "",
        results_table(rows),
        "",
        *([f"**{seen['lead']}**", ""] + ["- " + line for line in seen["lines"]] + [""] if seen else []),
        "\n".join("- " + n for n in source_notes(rows, report.metrics, report.paths)),
        "",
        "Where each model's figures come from (a list file keeps the rows of the models a later run did not "
        "evaluate; Made: when its row was made):",
        "",
        md_table(*sources_table(rows)),
        "",
    ]
    md += _benchmark_section(report)
    if report.front is not None:
        md.append(frontier_note(report.front, report.rows) + "\n")
    note = retrieval_note(rows)
    if note is not None:
        md.append(note + "\n")
    for png, alt in report.figures:
        md.append(f"![{alt}]({os.path.relpath(os.path.abspath(png), md_dir)})\n")
    md += _finetune_section(report, md_dir)
    md += _classification_section(report, md_dir)
    md += _blind_section(report)
    md += _prior_section(report)
    md += _image_side_section(report, md_dir)
    attribution = attribution_lines(rows, report.metrics, report.paths, report.explain_missing)
    if attribution is not None:
        md += (
            ["## Which word does a model blame?", "", attribution["lead"], ""]
            + ["- " + line["text"] for line in attribution["lines"]]
            + [""]
            + ([attribution["missing"], ""] if attribution["missing"] else [])
        )
        detection = attribution["detection"]
        if detection is not None:
            md += (
                ["### Misalignment detection: F-CLIPScore against CLIPScore", "", detection["lead"], ""]
                + ["- " + line["text"] for line in detection["lines"]]
                + [""]
            )
    md += _factors_section(report, md_dir)
    if report.tops is not None:
        md.append(_top_tables(report))
        if report.missing:
            md.append("\n" + missing_note(report.missing))
    md += ["", "---", f"<sub>Made by {made_by(report.prov)}.</sub>", ""]
    return "\n".join(md)


def write_markdown(path, report, files=None):
    with (files.open if files else atomic_open)(path) as f:
        f.write(markdown(report, path))
