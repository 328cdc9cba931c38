"""lgip.report.tables: the results table's columns (`RESULT_COLUMNS`, shared by the markdown and
the page), numbers as the report prints them, markdown tables, and the CSV.

A column of the results table names a row's figure; its interval, when the row has one, is the
figure's `_ci_lo` / `_ci_hi`. Columns that no row has are left out (a report without retrieval
or explain metrics has no such column).

    >>> cell({"gap": 0.0123, "gap_ci_lo": 0.01, "gap_ci_hi": 0.02}, "gap", 4)
    '0.0123 [0.0100, 0.0200]'
    >>> print(md_table(["Model", "Gap"], [["a", "0.1"]], ["l", "r"]))
    | Model | Gap |
    |-------|----:|
    | a     | 0.1 |
"""

import csv
import io
from dataclasses import dataclass

from ..method import FLIP_TYPES
from ..outputs import atomic_open
from .evaluations import COLUMNS
from .seen_text import seen_mark


@dataclass(frozen=True)
class Column:
    header: str  # as shown, with its arrow: which way is better
    name: str  # the row's key (and its CSV column)
    digits: int
    better: str  # "low" or "high"; "" for a control, neither better (no arrow, no best model)
    title: str = ""  # what it is, on the page's header (hover); "" = "<name>: <better>er is better"


PRIOR_TITLE = (
    "prior_pos_rate: a control, not a score: the share of flips the caption beats on the average OTHER "
    "image (what the text alone gets right); neither higher nor lower is better: compare it with Pos. rate"
)
GROUNDED_TITLE = (
    "grounded_pos_rate: the share of flips the caption beats by more on its own image than on the "
    "average other image; 0.5 = the image decides nothing; higher is better"
)

# columns in a model's score units (LGIP_SPEC.md 13): no best model among models of several score kinds
IN_SCORE_UNITS = (
    "invariance_error",
    "gap",
    "image_invariance_error",
    "image_gap",
    "enhanced_simple_invariance_error",
    "enhanced_advanced_invariance_error",
)
REL_TITLE = (
    "invariance_error_rel (LGIP_SPEC.md 13): the invariance error divided by how far another image's caption "
    "(the previous record's) moves the score (0: a paraphrase never moves it; 1: as far as another image's "
    "caption does); comparable across score kinds (cosine, logprob, itm_logodds); lower is better"
)
IMAGE_INV_TITLE = (
    "image_invariance_error_mean (run_lgip_images.py): mean |sim(altered image, caption) − sim(image, "
    "caption)| over jpeg, downscale, crop, hflip: the score should stay put; lower is better"
)
IMAGE_GAP_TITLE = (
    "image_sensitivity_gap_mean (run_lgip_images.py): mean sim(image, caption) − sim(altered image, caption) "
    "over mix and patch (another image blended or pasted in); higher is better"
)
IMAGE_POS_TITLE = (
    "image_sensitivity_pos_rate (run_lgip_images.py): share of mix and patch images scored below the "
    "original for its caption (0.5 = chance); higher is better"
)


def type_label(t):
    """A flip type as the report's headers name it: 'Color', 'Add att', 'Same concept'."""
    return t.replace("_", " ").capitalize()


def result_columns_for(types):
    """The results table's columns with a positive-rate column per flip type of `types`."""
    return (
        [
            Column("Inv. error ↓", "invariance_error", 4, "low"),
            Column("Inv. rel. ↓", "invariance_error_rel", 3, "low", REL_TITLE),
            Column("Gap ↑", "gap", 4, "high"),
            Column("Pos. rate ↑", "pos_rate", 3, "high"),
            Column("Prior pos.", "prior_pos_rate", 3, "", PRIOR_TITLE),
            Column("Grounded pos. ↑", "grounded_pos_rate", 3, "high", GROUNDED_TITLE),
            Column("I2T R@1 ↑", "retrieval_i2t_recall@1", 3, "high"),
            Column("Flip top\u20111 ↓", "retrieval_i2t_flip_top1_rate", 3, "low"),
            Column("Img. inv. ↓", "image_invariance_error", 4, "low", IMAGE_INV_TITLE),
            Column("Img. gap ↑", "image_gap", 4, "high", IMAGE_GAP_TITLE),
            Column("Img. pos. ↑", "image_pos_rate", 3, "high", IMAGE_POS_TITLE),
        ]
        + [Column(f"{type_label(t)} pos. ↑", f"{t}_pos_rate", 3, "high") for t in types]
        + [
            Column("Simple inv. ↓", "enhanced_simple_invariance_error", 4, "low"),
            Column("Advanced inv. ↓", "enhanced_advanced_invariance_error", 4, "low"),
            Column("Combined pos. ↑", "enhanced_combined_pos_rate", 3, "high"),
            Column("Loc. acc. ↑", "localization_acc", 3, "high"),
        ]
    )


# (retrieval beside the positive rate: the comparison the LGIP paper makes; the text-prior controls right
# after it: how much of it the text alone explains, LGIP_SPEC.md 9; the image side's headline figures
# next, the same three questions asked of images, LGIP_SPEC.md 11; a column per flip type: LGIP's three,
# or an imported benchmark's own, as the rows' `_types` say)
RESULT_COLUMNS = result_columns_for(FLIP_TYPES)


def row_types(rows):
    """The flip types of the rows' per-type columns (lgip.report.build_rows' `_types`; LGIP's
    when the rows do not say)."""
    return next((r["_types"] for r in rows if r.get("_types") is not None), list(FLIP_TYPES))


def num(value, digits):
    return "–" if value is None else f"{value:.{digits}f}"


def interval(row, name, digits):
    """'[0.0869, 0.1316]', or '' when the figure has no interval."""
    lo, hi = row.get(name + "_ci_lo"), row.get(name + "_ci_hi")
    return "" if lo is None or hi is None else f"[{lo:.{digits}f}, {hi:.{digits}f}]"


def cell(row, name, digits):
    """'0.1088 [0.0869, 0.1316]' (or the bare value when there is no interval)."""
    v = row.get(name)
    if v is None:
        return "–"
    ci = interval(row, name, digits)
    return f"{v:.{digits}f} {ci}" if ci else num(v, digits)


def md_text(text, limit=0):
    """A caption as a markdown table cell: one line, cut to `limit` characters, escaped."""
    text = " ".join(str(text).split())
    if limit and len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("*", "\\*").replace("_", "\\_")


def md_table(header, rows, align=None):
    """A markdown table padded so the raw text reads as a table too."""
    cells = [list(map(str, header))] + [list(map(str, r)) for r in rows]
    width = [max(len(r[j]) for r in cells) for j in range(len(header))]
    align = align or ["l"] * len(header)

    def line(r):
        return "| " + " | ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(r, width, align)) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if a == "r" else ("-" * (w + 2)) for w, a in zip(width, align)) + "|"
    return "\n".join([line(cells[0]), rule] + [line(r) for r in cells[1:]])


def result_columns(rows):
    """The columns of RESULT_COLUMNS (per flip type: the rows' types) that some row has a figure for."""
    types = row_types(rows)
    spec = RESULT_COLUMNS if types == list(FLIP_TYPES) else result_columns_for(types)
    return [c for c in spec if any(r.get(c.name) is not None for r in rows)]


def main_table(rows):
    """(header, cells, align) of the report's main table; columns nobody has are left out."""
    spec = result_columns(rows)
    header = ["Model", "Records"] + [c.header for c in spec]
    cells = [  # (a model that may have seen the probed images in training: marked by its name, lgip.report.seen_text)
        [r["label"] + (f" ({seen_mark(r)})" if seen_mark(r) else ""), num(r["num_records"], 0)]
        + [cell(r, c.name, c.digits) for c in spec]
        for r in rows
    ]
    return header, cells, ["l"] + ["r"] * (len(header) - 1)


def _fmt_csv(v):
    if v is None:
        return ""
    return repr(v) if isinstance(v, float) else str(v)


def write_csv(path, rows, columns=COLUMNS, files=None):
    """One line per row, every column; floats written exactly (repr), None as empty. files: the
    lgip.outputs.OutputSet it belongs to (None: written at once)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow([_fmt_csv(r.get(c)) for c in columns])
    with (files.open if files else atomic_open)(path) as f:
        f.write(buf.getvalue())
