"""lgip.report.fields: reading one model's metrics safely. A field the report uses is checked as it is
read (`number`, `count`, `fig`: a finite number, a rate within [0, 1], a mean of absolute differences
>= 0, an interval [low, high]), and a bad one is a `BadField` naming its whole dotted path
('corrected.global_sensitivity.pos_rate'), which lgip.report.evaluations.load_metrics turns into an
InputError naming the file, the model and the field. Also the names of the figures a row has
(FIGURES, CONTROLS) and the model card's fields (LGIP_SPEC.md 12).

    >>> fig({"pos_rate": 0.6, "pos_rate_ci95": [0.5, 0.7]}, "pos_rate")
    {'pos_rate': 0.6, 'pos_rate_ci_lo': 0.5, 'pos_rate_ci_hi': 0.7}
"""

import re

from ..method import CARD_FIELDS, CARD_FIELDS_WHEN_KNOWN
from ..util import finite_number


FIGURES = ("invariance_error", "gap", "pos_rate")  # the headline figures, each with a CI
# LGIP_SPEC.md sections 9 and 10, in run_lgip_multi.py's and run_lgip_by_fliptype.py's rows: (key in
# the metrics, name in a row); each with a CI, None in an older file (written before them) or with
# fewer than 2 images (prior and grounded) or no paraphrase (the hard positives)
CONTROLS = (
    ("prior_pos_rate", "prior_pos_rate"),
    ("grounded_pos_rate", "grounded_pos_rate"),
    ("prior_gap_mean", "prior_gap"),
    ("grounded_gap_mean", "grounded_gap"),
    ("invariance_error_prior_mean", "invariance_error_prior"),
    ("invariance_error_grounded_mean", "invariance_error_grounded"),
    ("robust_pos_rate", "robust_pos_rate"),
    ("text_only_rate", "text_only_rate"),
)
CONTROL_FIGURES = tuple(name for _, name in CONTROLS)
TYPE_CONTROLS = CONTROLS[:4] + CONTROLS[6:]  # a by_flip_type block's (no paraphrase figures)
# LGIP_SPEC.md 13: the invariance error comparable across score kinds (None in an older file)
RELATIVE = "invariance_error_rel"
# a metrics key of a mean of |differences|: >= 0
NON_NEGATIVE = re.compile(r"(^|_)(inv_error|invariance_error)(_\w+)?_mean$")
RATE = re.compile(r"(rate|recall|acc|chance|agreement)(@\d+)?(_detected|_preferred)?$")  # figures in [0, 1]


def with_ci(names):
    """Each figure's column and its interval's: [name, name_ci_lo, name_ci_hi, ...]."""
    return [n + suffix for n in names for suffix in ("", "_ci_lo", "_ci_hi")]


class BadField(ValueError):
    """A field of one model's metrics that the report cannot use: `field` (dotted), why."""

    def __init__(self, field, why):
        super().__init__(f"field '{field}' {why}")
        self.field = field


class Block(dict):
    """A block of one model's metrics that knows where it lies (`where`: 'corrected.global_sensitivity.'),
    so that a bad value in it is named by its whole path."""

    where = ""


def what_is(v):
    return f"the string {v!r}" if isinstance(v, str) else f"{v!r} ({type(v).__name__})"


def block(parent, key):
    """parent[key] as a Block: {} when absent or null; BadField when it is not an object."""
    parent = parent if isinstance(parent, Block) else Block(parent or {})
    v = parent.get(key)
    if v is not None and not isinstance(v, dict):
        raise BadField(parent.where + key, f"is {what_is(v)}, not an object")
    out = Block(v or {})
    out.where = parent.where + key + "."
    return out


def checked(field, v, name):
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadField(field, f"is {what_is(v)}, not a number")
    if not finite_number(v):  # (an int too large for a float too)
        raise BadField(field, f"is {v!r}, not a finite number"[:200])
    if RATE.search(name) and not 0.0 <= v <= 1.0:
        raise BadField(field, f"is {v!r}, not a rate within [0, 1]")
    if NON_NEGATIVE.search(field.rsplit(".", 1)[-1].removesuffix("_ci95")) and v < 0:
        raise BadField(field, f"is {v!r}, not a mean of absolute differences (>= 0)")
    return v


def number(b, key, name=None, required=False):
    """b[key]: None (null or absent: a figure not measured, e.g. no pairs) or a finite number, a
    rate within [0, 1]; BadField for NaN, Inf, a string, a rate out of range, or a `required`
    field that is not there at all."""
    b = b if isinstance(b, Block) else Block(b or {})
    if key not in b and required:
        raise BadField(b.where + key, "is missing (null where nothing was measured)")
    return checked(b.where + key, b.get(key), name or key)


def count(b, key):
    """b[key]: None or an int >= 0."""
    b = b if isinstance(b, Block) else Block(b or {})
    v = b.get(key)
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
        raise BadField(b.where + key, f"is {what_is(v)}, not a count (an int >= 0)")
    return v


def fig(b, key, name=None, required=False):
    """{name: value, name_ci_lo, name_ci_hi} from b[key] and b[key + "_ci95"] (null: no interval,
    else two finite numbers, low <= high), each checked (`number`)."""
    name = name or key
    b = b if isinstance(b, Block) else Block(b or {})
    value = number(b, key, name, required)
    ci = b.get(key + "_ci95")
    if ci is None:
        lo = hi = None
    elif not isinstance(ci, (list, tuple)) or len(ci) != 2:
        raise BadField(b.where + key + "_ci95", f"is {what_is(ci)}, not [low, high] or null")
    else:
        lo, hi = (checked(b.where + key + "_ci95", v, name) for v in ci)
        if (lo is None) != (hi is None) or (lo is not None and lo > hi):
            raise BadField(b.where + key + "_ci95", f"is {ci!r}, not [low, high] with low <= high")
    return {name: value, name + "_ci_lo": lo, name + "_ci_hi": hi}


CARD_NUMBERS = (
    "params_image",
    "params_text",
    "params_total",
    "embed_dim",
    "image_size",
    "context_length",
    "samples_seen",
)


def check_card(m):
    """One model's `model_card` (LGIP_SPEC.md 12), checked: an object or absent, its counts None or
    numbers > 0 (`params_image` 0 too in the row of a model that reads no image, `reads_images` false: it has no
    image tower), its other fields None or strings, and where written, `quick_gelu` a boolean, a fine-tune's facts
    strings and `card_sources` an object of strings; and the row's `images_seen_overlap` beside it (check_overlap;
    BadField for the first that is not)."""
    card = block(m, "model_card")
    blind = m.get("reads_images") is False
    for key in CARD_FIELDS:
        v = card.get(key)
        if v is None:
            continue
        if key in CARD_NUMBERS:
            value = checked(card.where + key, v, key)
            if blind and key == "params_image" and value == 0:
                continue
            if value <= 0:
                raise BadField(
                    card.where + key,
                    f"is {v!r}, not a number > 0 (or null: unknown)"
                    + ("; 0 only in the row of a model that reads no image (reads_images: false)" if not value else ""),
                )
        elif not isinstance(v, str):
            raise BadField(card.where + key, f"is {what_is(v)}, not a string (or null: unknown)")
    for key in CARD_FIELDS_WHEN_KNOWN:  # (a fine-tune's facts and the activation a spec says, where written)
        v = card.get(key)
        if v is None:
            continue
        if key == "quick_gelu" and not isinstance(v, bool):
            raise BadField(card.where + key, f"is {what_is(v)}, not true or false (or absent: not said)")
        if key == "card_sources" and not (isinstance(v, dict) and all(isinstance(c, str) for c in v.values())):
            raise BadField(card.where + key, f"is {what_is(v)}, not an object of citations {{field: text}}")
        if key not in ("quick_gelu", "card_sources") and not isinstance(v, str):
            raise BadField(card.where + key, f"is {what_is(v)}, not a string (or null: unknown)")
    check_overlap(m)


def check_overlap(m):
    """A row's `images_seen_overlap` (lgip.overlap), checked: absent, or {"status": "counted", "count" and
    "probed_images" counts, "fraction" a rate or null} or {"status": "unknown", "images_seen" a string}."""
    flag = m.get("images_seen_overlap")
    if flag is None:
        return
    where = "images_seen_overlap"
    if not isinstance(flag, dict) or flag.get("status") not in ("counted", "unknown"):
        raise BadField(where, f'is {what_is(flag)}, not an object whose status is "counted" or "unknown"')
    b = Block(flag)
    b.where = where + "."
    if flag["status"] == "counted":
        count(b, "count"), count(b, "probed_images"), number(b, "fraction", "rate")
    elif not isinstance(flag.get("images_seen"), str):
        raise BadField(where + ".images_seen", f"is {what_is(flag.get('images_seen'))}, not a string")
