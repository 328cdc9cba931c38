"""lgip.report.overview: what the report says around its figures, once for the markdown and the
page: the evaluations found (a table), the package versions they ran with, where each figure
comes from and what it means (notes), the Pareto sentence, and what made the report.

Texts are markdown inline text (`code` in backticks): the markdown prints them as they are, the
page turns the backticks into <code>.

    >>> header, cells, versions = runs_table(metrics, found)
    >>> cells[0][:2]
    ['`run_lgip_multi.py`', '`x_with_perturb__LGIP_ALL.metrics.json`']
    >>> source_notes(rows, metrics, found)[0]
    'Invariance error, gap and positive rate from `run_lgip_multi.py` (`x_with_perturb__LGIP_ALL.metrics.json`).'
"""
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .metrics import EVALUATIONS, SCRIPTS, enhanced_blocks


@dataclass
class Report:
    """Everything the markdown and the page say, gathered by report.py; a later step adds a field
    (say retrieval metrics) and the writers that show it."""
    jsonl_path: str  # the JSONL_PATH the report is about
    rows: List[dict]  # one per model (lgip.report.metrics.build_rows)
    metrics: Dict[str, list]  # evaluation -> its per-model metrics
    paths: Dict[str, str]  # evaluation -> its metrics file
    prov: dict  # what made the report (lgip.util.provenance)
    front: Optional[list] = None  # the models on the Pareto frontier; None: no frontier figure
    figures: List[tuple] = field(default_factory=list)  # (png path, alt text) of each figure written
    tops: Any = None  # lgip.report.toplists.TopLists, or None when TOP_K = 0
    missing: list = field(default_factory=list)  # score files the metrics list but that are not there
    top_k_per_model: bool = False  # the markdown's lists: per model, or one over all models
    max_text_chars: int = 0  # the markdown lists' captions cut to this many characters

    @property
    def stem(self):
        return os.path.splitext(os.path.basename(self.jsonl_path))[0]

    @property
    def protocols(self):
        return sorted({r["protocol"] or "unknown (no run info)" for r in self.rows})


def runs_table(metrics, paths):
    """(header, cells, versions) describing each evaluation found; versions: [(which, {package:
    version})], `which` naming the evaluations when they ran with different versions, else ''."""
    header = ["Evaluation", "Metrics file", "Input", "Protocol", "Models", "Records in file",
              "Records evaluated", "Unreadable images"]
    cells, versions = [], {}
    for e in EVALUATIONS:
        if e.key not in metrics:
            continue
        ms = metrics[e.key]
        runs = [m.get("run") or {} for m in ms]
        protocols = sorted({(r.get("model") or {}).get("protocol") or "?" for r in runs})
        inputs = sorted({(r.get("config") or {}).get("JSONL_PATH") or "?" for r in runs})
        in_file = sorted({str(r.get("num_records_in_file", "?")) for r in runs})
        evaluated = sorted({str((m.get("corrected") or {}).get("num_records", "?") if e.key == "enhanced"
                                else m.get("num_samples", "?")) for m in ms})
        failed = [r.get("num_failed_images") for r in runs if r.get("num_failed_images") is not None]
        cells.append([f"`{e.script}`", f"`{os.path.basename(paths[e.key])}`",
                      ", ".join(f"`{os.path.basename(p)}`" if p != "?" else "?" for p in inputs),
                      ", ".join(protocols), str(len(ms)), ", ".join(in_file), ", ".join(evaluated),
                      str(max(failed)) if failed else "?"])
        for r in runs:
            if r.get("versions"):
                versions.setdefault(tuple(r["versions"].items()), []).append(e.key)
    listed = [("" if len(versions) == 1 else ", ".join(dict.fromkeys(keys)), dict(items))
              for items, keys in versions.items()]
    return header, cells, listed


def source_notes(rows, metrics, paths):
    """Where the table's figures come from, and what they mean (one sentence each)."""
    notes = []
    heads = list(dict.fromkeys(r["headline_source"] for r in rows if r["headline_source"]))
    notes.append("Invariance error, gap and positive rate from " + ", ".join(
        f"`{SCRIPTS[h]}` (`{os.path.basename(paths[h])}`"
        + (f", {enhanced_blocks(metrics[h][0])[2]} figures" if h == "enhanced" else "") + ")" for h in heads) + ".")
    typed = list(dict.fromkeys(r["flip_type_source"] for r in rows if r["flip_type_source"]))
    if typed:
        notes.append("Per-type positive rates from " + ", ".join(f"`{SCRIPTS[t]}`" for t in typed)
                     + (" (enhanced: corrected figures, no intervals)" if "enhanced" in typed else "") + ".")
    if "enhanced" in metrics:
        label = enhanced_blocks(metrics["enhanced"][0])[2]
        notes.append("Simple/advanced invariance error" + (" and combined (paraphrase + flip) positive rate"
                     if label == "corrected" else "") + f" from `{SCRIPTS['enhanced']}`, {label} figures"
                     + (" (each flip counted once, `combined_caps` evaluated)." if label == "corrected"
                        else " (no `corrected` block: an older analysis file)."))
    notes.append("Invariance error = mean |sim(image, caption) − sim(image, paraphrase)|; gap = mean "
                 "sim(image, caption) − sim(image, flip); positive rate = share of flips with gap > 0 "
                 "(0.5 = chance). [lo, hi] = 95% bootstrap CI over images.")
    return notes


def frontier_note(front):
    """The Pareto sentence for the models on the frontier (tags, by invariance error)."""
    return ("Pareto frontier (no other model has both a lower invariance error and a higher positive rate): "
            + ", ".join(f"`{m}`" for m in front) + ".")


def missing_note(missing):
    """The score files the metrics list but that are not there, or None."""
    if not missing:
        return None
    return ("Score files listed in the metrics but missing: "
            + ", ".join(dict.fromkeys(f"`{os.path.basename(p)}`" for _, _, p in missing)) + ".")


def made_by(prov):
    """'`report.py` on <time> (<settings>; <versions>)' from a provenance block."""
    settings = ", ".join(f"{k}={v!r}" for k, v in prov["config"].items() if k != "JSONL_PATH")
    return (f"`{prov['script']}` on {prov['created']} ({settings}; "
            + ", ".join(f"{k} {v}" for k, v in prov["versions"].items()) + ")")
