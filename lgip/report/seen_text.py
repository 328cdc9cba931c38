"""lgip.report.seen_text: the models that may have seen the probed images in training (each row's
`images_seen_overlap`, lgip.overlap), said beside their figures: a mark by the model's name in the results
table (`seen_mark`) and a line per model under it (`seen_lines`), in the markdown and on the page.

    >>> seen_mark({"_overlap": {"status": "counted", "count": 3, "probed_images": 12}})
    'seen 3/12'
"""

from ..overlap import overlap_text

SEEN_LEAD = (
    "Images seen in training: a model probed on images it was trained on is not probed on new images, and its "
    "figures are not comparable with the others'."
)


def seen_mark(row):
    """'seen k/n' (an arm, counted from its split files), 'seen?' (a card that says it saw COCO's images, on a
    COCO input: unknown), '' for no question."""
    flag = row.get("_overlap")
    if not isinstance(flag, dict):
        return ""
    if flag.get("status") == "counted":
        return f"seen {flag.get('count')}/{flag.get('probed_images')}"
    return "seen?"


def seen_lines(rows):
    """{"lead", "lines": ["`model`: its flag in words"]} for the rows with a flag; None when none has one."""
    lines = [f"`{r['model']}` ({seen_mark(r)}): {overlap_text(r['_overlap'])}." for r in rows if seen_mark(r)]
    return {"lead": SEEN_LEAD, "lines": lines} if lines else None
