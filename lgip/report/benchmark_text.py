"""lgip.report.benchmark_text: an imported benchmark's own table (LGIP_SPEC.md 10: SugarCrepe,
SugarCrepe++, RoCOCO), as the benchmark reports it: its accuracy or positive rate per type and its mean,
with the LGIP figures beside them, for the markdown and the page alike.

    >>> benchmark_lines(rows, bench, found)["tables"][0]["caption"]
"""

import os

from .evaluations import SCRIPTS
from .tables import interval, row_types


def _bench_cell(r, key, digits, best):
    v = r.get(key)
    return {
        "text": "–" if v is None else f"{v:.{digits}f}",
        "ci": interval(r, key, digits),
        "value": v,
        "best": v is not None and v == best.get(key),
    }


def _bench_table(rows, spec, caption, groups=None):
    """{"caption", "groups", "header": [{text, sub, title}], "rows": [{model, label, cells}]} from spec
    [(header, sub, key, title)]: a figure per cell with its interval, the column's best (highest) bold."""
    best = {}
    for _, _, key, _ in spec:
        values = [r[key] for r in rows if r.get(key) is not None]
        best[key] = max(values) if len(values) > 1 else None
    return {
        "caption": caption,
        "groups": groups,
        "header": [{"text": h, "sub": sub, "title": title} for h, sub, _, title in spec],
        "rows": [
            {"model": r["model"], "label": r["label"], "cells": [_bench_cell(r, key, 3, best) for _, _, key, _ in spec]}
            for r in rows
        ],
    }


def benchmark_lines(rows, bench, paths):
    """{"title", "lead", "tables", "notes"} of the section "<Benchmark> table": the imported benchmark's
    results as its own paper tables them (rows = models; a column per type: its accuracy, the positive
    rate of that type's pairs, with its interval; their unweighted mean; SugarCrepe++'s ITT and TOT,
    the hard positives, overall and by type); None when the report is not about an imported benchmark
    (lgip.report.benchmark_source)."""
    if bench is None:
        return None
    types = row_types(rows)
    name = bench["name"]
    typed = list(dict.fromkeys(r["flip_type_source"] for r in rows if r.get("flip_type_source")))
    if not typed:
        return {
            "title": f"{name} table",
            "lead": f"No per-type figures: run `{SCRIPTS['fliptypes']}` on the file "
            "(run_all.py --BENCHMARK_JSONL=... does) for the benchmark's accuracy by type.",
            "tables": [],
            "notes": [],
        }

    def count(t):
        counts = {r.get(f"{t}_count") for r in rows}
        if len(counts) != 1 or None in counts:
            return ""
        n = counts.pop()
        return f"{n} item{'s' if n != 1 else ''}"

    source = ", ".join(
        f"`{SCRIPTS[k]}` (`{os.path.basename(paths[k])}`)" if k in paths else f"`{SCRIPTS[k]}`" for k in typed
    )
    where = (
        f"{name}'s items as LGIP records (`import_benchmark.py`, `{os.path.basename(bench['meta_path'])}`)"
        if bench["meta"] is not None
        else "an input whose flip types are not LGIP's (no `import_benchmark.py` "
        "meta file beside it: the benchmark is not named)"
    )
    accuracy = (
        "the benchmark's accuracy of that type: the positive rate of its pairs, the share whose image scores "
        "the caption above the negative (strictly, as the benchmark's own evaluation scores them)"
        if bench["accuracy"]
        else "the positive rate of that type's pairs, the share whose image scores the caption above its altered "
        "version (RoCOCO itself reports retrieval with the altered captions in the gallery: `run_lgip_retrieval.py`'s "
        "flip top-1 rate, by type in the CSV)"
        if bench["source"] == "rococo"
        else "the positive rate of that type's pairs, the share whose image scores the caption above the negative "
        "(the accuracy of a benchmark that scores pairs)"
    )
    lead = (
        f"The input holds {where}, evaluated by {source}. Each type's column is {accuracy}, with its 95% interval "
        f"over images. Mean: the unweighted mean over the {len(types)} types, as the benchmarks report it (each type "
        "counts once, whatever its number of items; no interval)."
    )
    spec = [(t, count(t), f"{t}_pos_rate", f"{t}: positive rate of its pairs (its accuracy)") for t in types]
    spec.append(("Mean", f"of {len(types)} types", "benchmark_mean_pos_rate", "unweighted mean over the types"))
    hard = any(r.get("robust_pos_rate") is not None for r in rows)
    if hard:
        spec += [
            (
                "ITT",
                "robust_pos_rate",
                "robust_pos_rate",
                "the image scores the caption and its paraphrase above "
                "the negative (SugarCrepe++'s ITT), over all pairs",
            ),
            (
                "TOT",
                "text_only_rate",
                "text_only_rate",
                "the text tower alone puts the paraphrase nearer the caption "
                "than the negative (SugarCrepe++'s TOT), over all pairs",
            ),
        ]
        lead += (
            " ITT (`robust_pos_rate`): the share of pairs where the image scores the caption AND its paraphrase "
            "(SugarCrepe++'s second true caption) above the negative, SugarCrepe++'s image-to-text accuracy; TOT "
            "(`text_only_rate`): the share where the text tower alone puts the paraphrase nearer the caption than "
            "the negative, both ways, its text-only accuracy; both over all pairs here, by type below."
        )
    tables = [_bench_table(rows, spec, "Accuracy by type")]
    if any(r.get(f"{t}_robust_pos_rate") is not None for r in rows for t in types):
        by_type = []
        for t in types:
            by_type += [
                ("ITT", t, f"{t}_robust_pos_rate", f"{t}: ITT (robust_pos_rate)"),
                ("TOT", t, f"{t}_text_only_rate", f"{t}: TOT (text_only_rate)"),
            ]
        by_type += [
            ("ITT", "mean", "benchmark_mean_robust_pos_rate", "unweighted mean of ITT over the types"),
            ("TOT", "mean", "benchmark_mean_text_only_rate", "unweighted mean of TOT over the types"),
        ]
        tables.append(_bench_table(rows, by_type, "ITT and TOT by type", [(t, 2) for t in types] + [("Mean", 2)]))
    notes = []
    meta = bench["meta"] or {}
    if meta.get("num_images_missing"):
        written, total = meta.get("items_written_by_type") or {}, meta.get("items_by_type") or {}
        left = sum(total.values()) - sum(written.values()) if written and total else None
        notes.append(
            f"{meta['num_images_missing']} of the benchmark's {meta.get('num_images', '?')} images were found in "
            f"no image folder when it was imported"
            + (f" ({left} items)" if left is not None else "")
            + ": their items are not in these figures (listed in "
            f"`{os.path.basename(bench['meta_path'])}`)."
        )
    absent = [t for t, n in (meta.get("items_by_type") or {}).items() if t not in types]
    if absent:
        notes.append("Types of the benchmark with no item evaluated here: " + ", ".join(f"`{t}`" for t in absent) + ".")
    if meta.get("source_url"):
        notes.append(f"{name}: {meta['source_url']}.")
    return {"title": f"{name} table", "lead": lead, "tables": tables, "notes": notes}
