"""lgip.report.attribution_text: the word attribution's section in words (explain_flips.py, LGIP_SPEC.md
8): what localization accuracy and its detected / preferred parts mean, one line per explained model
against chance, the misalignment detection (F-CLIPScore against CLIPScore), and what the gallery's
word scores cover. Markdown inline text, for the markdown and the page alike.

    >>> attribution_lines(rows, metrics, found)["lines"][0]["text"]      # the demo's, tiny models
    '`tiny_openclip`: localization 0.117 [0.052, 0.195] of 77 flips, chance 0.168: **at chance level** (its
     interval contains chance); detected 0.135 [0.027, 0.243] of 37 flips, preferred 0.100 [0.025, 0.200] of 40 flips.'
"""

import os

from .evaluations import SCRIPTS
from .tables import cell


def attribution_lines(rows, metrics, paths, missing=()):
    """{"lead", "lines": [{"model", "text"}], "missing", "detection"} of the word-attribution section:
    what localization accuracy and its detected / preferred parts mean, then one line per explained
    model with its figure, 95% interval and chance level, flagged when the interval contains
    chance; the explain files listed but missing (or None); and the misalignment detection's lines
    (detection_lines, or None). None without explain_flips.py metrics."""
    if "explain" not in metrics:
        return None
    layers = sorted({str(((m.get("run") or {}).get("config") or {}).get("LAYERS", "?")) for m in metrics["explain"]})
    lead = (
        f"From `{SCRIPTS['explain']}` (`{os.path.basename(paths['explain'])}`): each explained flip's "
        f"sim(image, flip) is attributed to its words (gradient × attention over the text tower's last "
        f"{' or '.join(layers)} layers) and its lowest-scoring word is blamed. Localization = share of the flips "
        "whose blamed word is the word the flip changed; chance = the share a randomly blamed word would get. "
        "Detected: over the flips the model scores below their caption (gap > 0): a hit says its lower score "
        "rests on the changed word. Preferred: over those it scores as high or higher (gap ≤ 0): a hit says it "
        "weighed the changed word and still preferred the flip. [lo, hi] = 95% bootstrap CI over flips."
    )
    explained = {m["model_tag"]: m for m in metrics["explain"]}
    lines = []
    for r in rows:
        if r["model"] not in explained:
            continue
        if r["localization_acc"] is None:
            why = explained[r["model"]].get("unsupported")
            lines.append(
                {
                    "model": r["model"],
                    "text": f"`{r['model']}`: " + (f"not explained ({why})." if why else "no flip explained."),
                }
            )
            continue
        lo, hi, chance = r["localization_acc_ci_lo"], r["localization_acc_ci_hi"], r["localization_chance"]
        where = (
            ""
            if lo is None or hi is None
            else ": **at chance level** (its interval contains chance)"
            if lo <= chance <= hi
            else ": below chance"
            if hi < chance
            else ": above chance"
        )
        parts = [
            f"{name} {cell(r, key, 3)} of {r[count]} flips"
            if r[key] is not None
            else f"{name} – of {r[count] or 0} flips"
            for name, key, count in (
                ("detected", "localization_acc_detected", "localization_num_detected"),
                ("preferred", "localization_acc_preferred", "localization_num_preferred"),
            )
        ]
        lines.append(
            {
                "model": r["model"],
                "text": f"`{r['model']}`: localization {cell(r, 'localization_acc', 3)} of "
                f"{r['localization_num_flips']} flips, chance {chance:.3f}{where}; " + ", ".join(parts) + ".",
            }
        )
    gone = (
        (
            "Explain files listed in the metrics but missing: "
            + ", ".join(f"`{os.path.basename(p)}`" for _, p in missing)
            + " (their flips are shown without word scores)."
        )
        if missing
        else None
    )
    return {"lead": lead, "lines": lines, "missing": gone, "detection": detection_lines(rows, explained)}


DETECTION_LEAD = (
    "Misalignment detection (F-CLIPScore, after CLIP4DM; LGIP_SPEC.md section 8): each explained flip's "
    "caption is attributed as its flip is, and a text's F-CLIPScore is F = (its blamed word's score) × "
    "(1 − s / 2.5), s = cos(image, text) its CLIPScore. AP = average precision of telling the captions "
    "(positives) from the flips (negatives) by F, and by s; F beats s when its AP is higher, by the "
    "difference F − s, [lo, hi] its 95% bootstrap interval over records: an interval that excludes 0 is a "
    "difference beyond resampling noise on these flips, nothing more (CLIP4DM's claim, tested on each model)."
)


def detection_line(r):
    """A model's misalignment detection in words, as explain_flips.py's console line says it
    (lgip.explain.detection_line), from its row; then the counts."""
    ap_s, ap_f, gain = r.get("detection_ap_clipscore"), r.get("detection_ap_fclipscore"), r.get("detection_ap_gain")
    if gain is None:
        return "misalignment detection: n/a (needs explained flips and their captions)"
    lo, hi = r.get("detection_ap_gain_ci_lo"), r.get("detection_ap_gain_ci_hi")
    where = (
        ""
        if lo is None or hi is None
        else (
            f" [{lo:+.3f}, {hi:+.3f}]"
            + ("; the interval excludes 0" if lo > 0 or hi < 0 else "; the interval includes 0")
        )
    )
    text = (
        f"misalignment detection (captions vs flips): AP by F-CLIPScore {ap_f:.3f}, by CLIPScore {ap_s:.3f}: "
        f"F {'beats' if gain > 0 else 'does not beat'} s by {gain:+.3f}{where}"
    )
    counts = [
        f"{r[k]} {what}"
        for k, what in (("detection_num_captions", "captions"), ("detection_num_flips", "flips"))
        if r.get(k) is not None
    ]
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
        text = (
            detection_line(r) + "."
            if "detection_ap_gain" in m
            else (
                "no misalignment detection in its explain metrics "
                "(written before F-CLIPScore: re-run `explain_flips.py`)."
            )
        )
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
    inputs = sorted(
        {
            os.path.basename(((m.get("run") or {}).get("config") or {}).get("JSONL_PATH") or "")
            for m in metrics["explain"]
        }
        - {""}
    )

    def flips(n):
        return f"{n} flip{'s' if n != 1 else ''}"

    explained = (
        f"{flips(total)} of `{next(iter(counts))}`"
        if len(counts) == 1
        else f"{flips(next(iter(counts.values())))} of each of {len(counts)} models ({total} in all)"
        if len(set(counts.values())) == 1
        else f"{flips(total)} over {len(counts)} models"
        if counts
        else flips(0)
    )
    return (
        f"{scored} of the {cards} flip card{'s' if cards != 1 else ''} on this page "
        f"{'shows' if scored == 1 else 'show'} word scores: `{SCRIPTS['explain']}` explained {explained}"
        + (f", on {', '.join(f'`{i}`' for i in inputs)}" if inputs else "")
        + "; a card whose flip is not among them shows none."
    )
