"""report: one report over every LGIP evaluation of a JSONL: table, CSV, frontier and flip-type plots.

Reads the metrics that run_lgip_multi.py, run_lgip_by_fliptype.py and
rebuttal_enhanced_lgip_by_transformation.py wrote for JSONL_PATH (the input of any of them, or
the base JSONL: then the derived inputs `<stem>_with_perturb.jsonl`, `<stem>_with_fliptypes.jsonl`
and `rebuttal_enhanced_<stem>_with_fliptypes.jsonl` beside it are looked at), all models, and
writes next to JSONL_PATH:
  <stem>__LGIP_report.md      inputs, protocol, models, counts, versions; main table; plots; top lists
  <stem>__LGIP_report.csv     one row per model, every figure, 95% CI bounds as separate columns
  <stem>__LGIP_frontier.png   invariance error against positive rate, CI whiskers, Pareto frontier
  <stem>__LGIP_fliptypes.png  positive rate per flip type and model (when a typed evaluation ran)
The top lists (paraphrases that move the score most, flips scored above their original) stream
the evaluations' per-pair score files, keeping only TOP_K rows. The table is printed too.
  python report.py --JSONL_PATH=lgip_coco_native5_train2017.jsonl
"""
import csv
import heapq
import io
import os
import re
import sys

import common

_HERE = os.path.dirname(os.path.abspath(__file__))
JSONL_PATH = os.path.join(_HERE, "lgip_coco_native5_train2017.jsonl")  # base JSONL, or the input of any of the three evaluations
OUTPUT_PREFIX = None  # str: outputs are <OUTPUT_PREFIX>report.md, ...frontier.png, ...; None = "<JSONL folder>/<JSONL stem>__LGIP_"
HEADLINE = "auto"  # evaluation giving the table's and frontier's invariance error, gap, positive rate: "auto" (multi, else fliptypes, else enhanced, per model), "multi", "fliptypes", "enhanced"
TOP_K = 10  # int >= 0: rows in each top list; 0 = no lists (score files not read)
TOP_K_PER_MODEL = False  # True: the top K of each model; False: the top K over all models
SCORE_SOURCES = None  # evaluations whose score files feed the top lists: None = all found, or a list of "multi", "fliptypes", "enhanced"
LABELS = {}  # dict model tag -> its label in the figures and tables; unlisted tags are shortened automatically
MAX_TEXT_CHARS = 90  # int: captions longer than this are cut with "…" in the markdown top lists; 0 = never
DPI = 150  # int: resolution of the PNGs (dots per inch; the frontier is 8 x 6 inches)
CONFIG = common.configure(globals())

# (key, script, metrics suffix, derived input of a base JSONL: (suffix, prefix))
EVALUATIONS = [
    ("multi", "run_lgip_multi.py", "LGIP_ALL.metrics.json", ("_with_perturb.jsonl", "")),
    ("fliptypes", "run_lgip_by_fliptype.py", "LGIP_fliptypes.metrics.json", ("_with_fliptypes.jsonl", "")),
    ("enhanced", "rebuttal_enhanced_lgip_by_transformation.py", "ENHANCED_LGIP_analysis.json",
     ("_with_fliptypes.jsonl", "rebuttal_enhanced_")),
]
EVAL_KEYS = [k for k, *_ in EVALUATIONS]
SCRIPTS = {k: s for k, s, *_ in EVALUATIONS}
SHORT_SOURCE = {"multi": "run_lgip_multi", "fliptypes": "run_lgip_by_fliptype", "enhanced": "enhanced analysis, corrected"}
FIGURES = ("invariance_error", "gap", "pos_rate")  # the headline figures, each with a CI


# ---------------------------------------------------------------------------
# Finding and reading the metrics
# ---------------------------------------------------------------------------

def find_metrics(jsonl_path):
    """{evaluation: metrics path} of the evaluations that ran on jsonl_path (or its derived
    inputs), and every path looked at."""
    found, looked = {}, []
    for key, _, suffix, (derived_suffix, derived_prefix) in EVALUATIONS:
        inputs = [jsonl_path, common.default_output(jsonl_path, derived_suffix, derived_prefix)]
        for path in (common.metrics_path(p, suffix) for p in inputs):
            looked.append(path)
            if key not in found and os.path.isfile(path):
                found[key] = path
    return found, looked


def load_metrics(path):
    """A metrics file: a list of per-model dicts, each with a model_tag."""
    data = common.read_json(path)
    if isinstance(data, dict):  # a single model's metrics file
        data = [data]
    if not isinstance(data, list) or not all(isinstance(m, dict) and "model_tag" in m for m in data):
        raise common.InputError(f"{path}: expected a list of per-model metrics with 'model_tag'")
    return data


def _fig(block, key, name=None):
    """{name: value, name_ci_lo, name_ci_hi} from block[key] and block[key + "_ci95"]."""
    name = name or key
    block = block or {}
    ci = block.get(key + "_ci95") or [None, None]
    return {name: block.get(key), name + "_ci_lo": ci[0], name + "_ci_hi": ci[1]}


def _enhanced_blocks(m):
    """(flip-once figures, combined figures or None, label): corrected when present, else published."""
    c = m.get("corrected")
    if isinstance(c, dict):
        return c, c.get("combined"), "corrected"
    return m, None, "published"


def extract(key, m):
    """The figures of one model's metrics from evaluation `key`, as flat CSV columns."""
    out = {}
    if key == "multi":
        out.update(_fig(m, "invariance_error_mean", "multi_invariance_error"))
        out.update(_fig(m, "sensitivity_gap_mean", "multi_gap"))
        out.update(_fig(m, "sensitivity_pos_rate", "multi_pos_rate"))
        out["multi_num_records"] = m.get("num_samples")
    elif key == "fliptypes":
        g = m.get("global_sensitivity") or {}
        out.update(_fig(m, "invariance_error_mean", "fliptypes_invariance_error"))
        out.update(_fig(g, "gap_mean", "fliptypes_gap"))
        out.update(_fig(g, "pos_rate", "fliptypes_pos_rate"))
        out["fliptypes_num_records"] = m.get("num_samples")
        for t in common.FLIP_TYPES:
            b = (m.get("by_flip_type") or {}).get(t) or {}
            out.update(_fig(b, "pos_rate", f"fliptypes_{t}_pos_rate"))
            out.update(_fig(b, "gap_mean", f"fliptypes_{t}_gap"))
            out[f"fliptypes_{t}_count"] = b.get("count")
    elif key == "enhanced":
        flips, combined, _ = _enhanced_blocks(m)
        g = flips.get("global_sensitivity") or {}
        out.update(_fig(m, "global_invariance_error_mean", "enhanced_invariance_error"))
        out.update(_fig(g, "gap_mean", "enhanced_gap"))
        out.update(_fig(g, "pos_rate", "enhanced_pos_rate"))
        out["enhanced_num_records"] = (m.get("corrected") or {}).get("num_records")
        for kind in ("simple", "advanced"):
            out.update(_fig(m, f"paraphrase_{kind}_inv_error_mean", f"enhanced_{kind}_invariance_error"))
        cg = (combined or {}).get("global_sensitivity") or {}
        out.update(_fig(cg, "pos_rate", "enhanced_combined_pos_rate"))
        out.update(_fig(cg, "gap_mean", "enhanced_combined_gap"))
        for t in common.FLIP_TYPES:  # per type: no CI in the enhanced analysis
            b = ((flips.get("error_type_stats") or {}).get(t) or {}).get("overall") or {}
            out.update(_fig(b, "pos_rate", f"enhanced_{t}_pos_rate"))
            out.update(_fig(b, "gap_mean", f"enhanced_{t}_gap"))
            out[f"enhanced_{t}_count"] = b.get("count")
    return out


def _columns():
    def ci(name):
        return [name, name + "_ci_lo", name + "_ci_hi"]
    cols = ["model", "label", "protocol", "num_records", "num_failed_images", "headline_source"]
    for f in FIGURES:
        cols += ci(f)
    cols.append("flip_type_source")
    for t in common.FLIP_TYPES:
        cols += ci(f"{t}_pos_rate") + ci(f"{t}_gap") + [f"{t}_count"]
    for name in ("simple_invariance_error", "advanced_invariance_error", "combined_pos_rate", "combined_gap"):
        cols += ci("enhanced_" + name)
    for key in EVAL_KEYS:  # each evaluation's own headline figures, whichever heads the table
        for f in FIGURES:
            cols += ci(f"{key}_{f}")
    return cols


COLUMNS = _columns()


def build_rows(metrics, headline="auto"):
    """One dict per model (CSV columns, in first-seen order over the evaluations) + its run info."""
    if headline not in ("auto", *EVAL_KEYS):
        raise common.InputError(f"unknown HEADLINE {headline!r}; valid: auto, {', '.join(EVAL_KEYS)}")
    if headline != "auto" and headline not in metrics:
        raise common.InputError(f"HEADLINE={headline!r} but no {SCRIPTS[headline]} metrics were found "
                                f"(found: {', '.join(metrics) or 'none'})")
    per_model = {}
    for key in EVAL_KEYS:
        for m in metrics.get(key, ()):
            entry = per_model.setdefault(m["model_tag"], {"values": {}, "runs": {}})
            entry["values"].update(extract(key, m))
            entry["runs"][key] = m
    rows = []
    for tag, entry in per_model.items():
        v, runs = entry["values"], entry["runs"]
        src = headline if headline != "auto" else next(k for k in EVAL_KEYS if k in runs)
        row = dict.fromkeys(COLUMNS)
        row.update({k: val for k, val in v.items() if k in row})
        row["model"] = tag
        if src in runs:
            row["headline_source"] = src
            for f in FIGURES:
                for suffix in ("", "_ci_lo", "_ci_hi"):
                    row[f + suffix] = v.get(f"{src}_{f}{suffix}")
            row["num_records"] = v.get(f"{src}_num_records")
        typed = next((k for k in ("fliptypes", "enhanced") if k in runs), None)
        if typed:
            row["flip_type_source"] = typed
            for t in common.FLIP_TYPES:
                for part in ("pos_rate", "gap"):
                    for suffix in ("", "_ci_lo", "_ci_hi"):
                        row[f"{t}_{part}{suffix}"] = v.get(f"{typed}_{t}_{part}{suffix}")
                row[f"{t}_count"] = v.get(f"{typed}_{t}_count")
        run_infos = [(runs[k].get("run") or {}) for k in EVAL_KEYS if k in runs]
        head_run = (runs.get(src) or runs[next(iter(runs))]).get("run") or {}
        row["protocol"] = (head_run.get("model") or {}).get("protocol")
        row["_type"] = next(((r.get("model") or {}).get("type") for r in run_infos if (r.get("model") or {}).get("type")), None)
        failed = [r.get("num_failed_images") for r in run_infos if r.get("num_failed_images") is not None]
        row["num_failed_images"] = max(failed) if failed else None
        if row["num_records"] is None:
            row["num_records"] = next((v.get(f"{k}_num_records") for k in EVAL_KEYS
                                       if v.get(f"{k}_num_records") is not None), None)
        rows.append(row)
    labels = short_labels([r["model"] for r in rows], LABELS)
    for r in rows:
        r["label"] = labels[r["model"]]
    return rows


# ---------------------------------------------------------------------------
# Labels, formatting
# ---------------------------------------------------------------------------

def short_label(tag):
    """A readable figure label for a model tag.

    >>> short_label("openclip_ViT-L-14_laion2b_s32b_b82k"), short_label("siglip_google_siglip-base-patch16-224")
    ('ViT-L-14 (laion2b)', 'siglip-base-patch16-224')
    """
    m = re.match(r"^openclip_(.+?)_(.+)$", tag)
    if m:
        pretrained = re.sub(r"_s\d+[mb]_b\d+k$", "", m.group(2))
        return f"{m.group(1)} ({pretrained})"
    m = re.match(r"^siglip2?_[^_]+_(siglip.*)$", tag)  # siglip_google_siglip-..., siglip2_google_siglip2-...
    if m:
        return m.group(1)
    return tag


def short_labels(tags, overrides=None):
    """tag -> label; automatic labels that would collide fall back to the full tag."""
    overrides = overrides or {}
    auto = {t: short_label(t) for t in tags}
    counts = {}
    for lab in auto.values():
        counts[lab] = counts.get(lab, 0) + 1
    return {t: overrides.get(t, auto[t] if counts[auto[t]] == 1 else t) for t in tags}


def _num(value, digits):
    return "–" if value is None else f"{value:.{digits}f}"


def _cell(row, name, digits):
    """'0.1088 [0.0869, 0.1316]' (or the bare value when there is no interval)."""
    v, lo, hi = row.get(name), row.get(name + "_ci_lo"), row.get(name + "_ci_hi")
    if v is None:
        return "–"
    if lo is None or hi is None:
        return _num(v, digits)
    return f"{v:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _md_text(text, limit=0):
    text = " ".join(str(text).split())
    if limit and len(text) > limit:
        text = text[:limit - 1].rstrip() + "…"
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


def main_table(rows):
    """(header, cells, align) of the report's main table; columns nobody has are left out."""
    spec = [("Inv. error ↓", "invariance_error", 4), ("Gap ↑", "gap", 4), ("Pos. rate ↑", "pos_rate", 3)]
    spec += [(f"{t.capitalize()} pos. ↑", f"{t}_pos_rate", 3) for t in common.FLIP_TYPES]
    spec += [("Simple inv. ↓", "enhanced_simple_invariance_error", 4),
             ("Advanced inv. ↓", "enhanced_advanced_invariance_error", 4),
             ("Combined pos. ↑", "enhanced_combined_pos_rate", 3)]
    spec = [s for s in spec if any(r.get(s[1]) is not None for r in rows)]
    header = ["Model", "Records"] + [s[0] for s in spec]
    cells = [[r["label"], _num(r["num_records"], 0) if r["num_records"] is not None else "–"]
             + [_cell(r, name, d) for _, name, d in spec] for r in rows]
    return header, cells, ["l"] + ["r"] * (len(header) - 1)


# ---------------------------------------------------------------------------
# Top lists from the score files
# ---------------------------------------------------------------------------

class _TopK:
    """The k largest scores offered, ties kept in order of arrival, each key at most once."""

    def __init__(self, k):
        self.k, self.heap, self.keys, self.seq = k, [], set(), 0

    def full(self):
        return len(self.heap) >= self.k

    def floor(self):
        return self.heap[0][0]

    def offer(self, score, key, row):
        if self.k <= 0 or (self.full() and score <= self.floor()) or key in self.keys:
            return
        self.seq += 1
        item = (score, -self.seq, key, row)
        if self.full():
            self.keys.discard(heapq.heapreplace(self.heap, item)[2])
        else:
            heapq.heappush(self.heap, item)
        self.keys.add(key)

    def rows(self):
        return [item[3] for item in sorted(self.heap, key=lambda x: (-x[0], -x[1]))]


def scan_scores(files, k, per_model=False):
    """Stream score files [(evaluation, model, path)] into the top-k paraphrase moves and
    flips preferred over their caption (flip gap < 0); duplicates across evaluations count once."""
    para_top, flip_top = {}, {}
    for source, model, path in files:
        bucket = model if per_model else None
        para = para_top.setdefault(bucket, _TopK(k))
        flip = flip_top.setdefault(bucket, _TopK(k))
        for _, r in common.iter_json_lines(path):  # (a byte-order mark at its start is fine)
            base = r.get("sim")
            if base is None:
                continue
            where = (model, r.get("image_path"), r.get("caption_index"))
            for p in r.get("paraphrases") or ():
                delta = p["sim"] - base
                if para.full() and abs(delta) <= para.floor():
                    continue
                para.offer(abs(delta), where + (p["text"],),
                           {"model": model, "source": source, "record": r, "text": p["text"],
                            "kind": p.get("kind"), "sim": p["sim"], "delta": delta})
            for fl in r.get("flips") or ():
                gap = base - fl["sim"]
                if gap >= 0 or (flip.full() and -gap <= flip.floor()):
                    continue
                flip.offer(-gap, where + (fl["text"],),
                           {"model": model, "source": source, "record": r, "text": fl["text"],
                            "type": fl.get("type"), "sim": fl["sim"], "gap": gap})
    for top in (para_top, flip_top):
        for key, t in top.items():
            top[key] = t.rows()
    for top in (para_top, flip_top):  # the records are only needed for a few fields
        for rows in top.values():
            for row in rows:
                r = row.pop("record")
                row.update(image=r.get("image_id") if r.get("image_id") is not None else os.path.basename(r.get("image_path", "")),
                           image_path=r.get("image_path"), caption=r.get("caption"), caption_sim=r.get("sim"))
    return para_top, flip_top


def score_files(metrics, paths, sources):
    """[(evaluation, model, score file)] that exist, and the missing ones."""
    files, missing = [], []
    for key in EVAL_KEYS:
        if key not in metrics or (sources is not None and key not in sources):
            continue
        folder = os.path.dirname(os.path.abspath(paths[key]))
        for m in metrics[key]:
            if not m.get("scores_file"):
                continue
            path = os.path.join(folder, m["scores_file"])
            (files if os.path.isfile(path) else missing).append((key, m["model_tag"], path))
    return files, missing


# ---------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------

def pareto_front(points):
    """Indices of the non-dominated (x, y) points, lower x and higher y being better, by x.

    >>> pareto_front([(0.1, 0.6), (0.2, 0.9), (0.3, 0.8), (0.1, 0.5)])
    [0, 1]
    """
    front = []
    for i, (x, y) in enumerate(points):
        dominated = any((xo <= x and yo >= y) and (xo < x or yo > y) for j, (xo, yo) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: (points[i][0], points[i][1]))


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"font.size": 11, "axes.titlesize": 13, "axes.labelsize": 12,
                         "legend.fontsize": 10, "xtick.labelsize": 10, "ytick.labelsize": 10,
                         "axes.spines.top": False, "axes.spines.right": False})
    return plt


FAMILY_MARKERS = {"OpenCLIP": "o", "SigLIP": "s"}


def _family(row):
    """'OpenCLIP', 'SigLIP' or 'other', from the run's model type, else the tag."""
    kind = row.get("_type") or ("siglip" if "siglip" in row["model"].lower() else
                                "openclip" if "clip" in row["model"].lower() else None)
    return {"openclip": "OpenCLIP", "siglip": "SigLIP"}.get(kind, "other")


def _model_colors(tags):
    import matplotlib
    cmap = matplotlib.colormaps["tab10" if len(tags) <= 10 else "tab20"]
    return {t: cmap(i % cmap.N) for i, t in enumerate(tags)}


def _save(fig, path):
    with common.atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=DPI)


def _err(v, lo, hi):
    return None if lo is None or hi is None else [[max(v - lo, 0.0)], [max(hi - v, 0.0)]]


def _place_labels(fig, ax, items, obstacles=()):
    """Annotate each (x, y, text) beside its point, avoiding other labels, points and the
    `obstacles` (data points, e.g. along the whiskers)."""
    renderer = fig.canvas.get_renderer()
    axbox = ax.get_window_extent(renderer)
    pts = [ax.transData.transform((x, y)) for x, y, _ in items]
    others = [ax.transData.transform(p) for p in obstacles]
    placed = []
    offsets = [(9, 7, "left", "bottom"), (9, -7, "left", "top"), (-9, 7, "right", "bottom"),
               (-9, -7, "right", "top"), (0, 12, "center", "bottom"), (0, -12, "center", "top"),
               (16, 0, "left", "center"), (-16, 0, "right", "center"), (9, 22, "left", "bottom"),
               (9, -22, "left", "top"), (-9, 22, "right", "bottom"), (-9, -22, "right", "top")]
    for n, (x, y, text) in enumerate(items):
        best = None
        for dx, dy, ha, va in offsets:
            ann = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", ha=ha, va=va,
                              fontsize=10, color="0.1", zorder=5,
                              bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.75))
            box = ann.get_window_extent(renderer).expanded(1.04, 1.1)
            cost = sum(box.overlaps(b) for b in placed) * 10
            cost += sum(1 for j, p in enumerate(pts) if j != n and box.x0 - 6 <= p[0] <= box.x1 + 6
                        and box.y0 - 6 <= p[1] <= box.y1 + 6) * 3
            cost += sum(1 for p in others if box.x0 <= p[0] <= box.x1 and box.y0 <= p[1] <= box.y1)
            cost += 20 * (box.x0 < axbox.x0 or box.x1 > axbox.x1 or box.y0 < axbox.y0 or box.y1 > axbox.y1)
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, ann, box)
            else:
                ann.remove()
            if cost == 0:
                break
        placed.append(best[2])


def plot_frontier(rows, path, title_note=""):
    """Invariance error (x) against positive rate (y), CI whiskers, Pareto frontier; None if no data."""
    pts = [r for r in rows if r["invariance_error"] is not None and r["pos_rate"] is not None]
    if not pts:
        return None
    plt = _pyplot()
    from matplotlib.lines import Line2D
    colors = _model_colors([r["model"] for r in rows])
    fig, ax = plt.subplots(figsize=(8, 6))
    xy = [(r["invariance_error"], r["pos_rate"]) for r in pts]
    front = pareto_front(xy)
    xs = [v for r in pts for v in (r["invariance_error"], r["invariance_error_ci_lo"], r["invariance_error_ci_hi"]) if v is not None]
    ys = [v for r in pts for v in (r["pos_rate"], r["pos_rate_ci_lo"], r["pos_rate_ci_hi"]) if v is not None]
    xpad = max((max(xs) - min(xs)) * 0.18, 0.01)
    ypad = max((max(ys) - min(ys)) * 0.18, 0.02)
    ax.set_xlim(max(0.0, min(xs) - xpad), max(xs) + xpad)
    ax.set_ylim(max(0.0, min(ys) - ypad), min(1.0, max(ys) + ypad) if max(ys) + ypad < 1.0 else 1.02)
    ax.grid(True, alpha=0.3, linewidth=0.8)
    lo_y, hi_y = ax.get_ylim()
    handles = []
    if lo_y <= 0.5 <= hi_y:
        ax.axhline(0.5, color="0.55", linestyle=":", linewidth=1.2, zorder=1)
        handles.append(Line2D([], [], color="0.55", linestyle=":", label="chance (0.5)"))
    if len(front) > 1:
        ax.plot([xy[i][0] for i in front], [xy[i][1] for i in front], "--", color="0.25", linewidth=1.6, zorder=2)
    handles.append(Line2D([], [], color="0.25", linestyle="--", marker="o", markerfacecolor="white",
                          markeredgecolor="0.1", markeredgewidth=1.6, label="Pareto frontier"))
    families = {}
    for i, r in enumerate(pts):
        c = colors[r["model"]]
        family = _family(r)
        marker = FAMILY_MARKERS.get(family, "D")
        families.setdefault(family, marker)
        on_front = i in front
        ax.errorbar(r["invariance_error"], r["pos_rate"],
                    xerr=_err(r["invariance_error"], r["invariance_error_ci_lo"], r["invariance_error_ci_hi"]),
                    yerr=_err(r["pos_rate"], r["pos_rate_ci_lo"], r["pos_rate_ci_hi"]),
                    fmt=marker, color=c, ecolor=c, elinewidth=1.3, capsize=3.5, markersize=9 if on_front else 7.5,
                    markeredgecolor="0.1" if on_front else "white", markeredgewidth=1.6 if on_front else 0.8,
                    alpha=1.0, zorder=4 if on_front else 3)
    for name, marker in families.items():
        handles.append(Line2D([], [], color="0.45", marker=marker, linestyle="none", markersize=7, label=name))
    ax.set_xlabel("Invariance error: mean |Δ sim| under paraphrase (lower is better)")
    ax.set_ylabel("Positive rate: flips scored below original (higher is better)")
    ax.set_title("LGIP: invariance vs. sensitivity" + (f"\n{title_note}" if title_note else ""), fontsize=13)
    handles.append(Line2D([], [], color="0.3", marker=r"$\nwarrow$", linestyle="none", markersize=13,
                          label="better: up and left"))
    ax.legend(handles=handles, loc="best", frameon=True, framealpha=0.9)
    fig.tight_layout()
    whiskers = []
    for r in pts:
        x, y = r["invariance_error"], r["pos_rate"]
        for lo, hi, horizontal in ((r["invariance_error_ci_lo"], r["invariance_error_ci_hi"], True),
                                   (r["pos_rate_ci_lo"], r["pos_rate_ci_hi"], False)):
            if lo is not None and hi is not None:
                for f in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0):
                    v = lo + f * (hi - lo)
                    whiskers.append((v, y) if horizontal else (x, v))
    _place_labels(fig, ax, [(r["invariance_error"], r["pos_rate"], r["label"]) for r in pts], whiskers)
    _save(fig, path)
    plt.close(fig)
    return [pts[i]["model"] for i in front]


def plot_fliptypes(rows, path, title_note=""):
    """Grouped bars: per model, the positive rate of each flip type with CI whiskers; None if no data."""
    pts = [r for r in rows if any(r[f"{t}_pos_rate"] is not None for t in common.FLIP_TYPES)]
    if not pts:
        return None
    plt = _pyplot()
    import numpy as np
    palette = {"color": "#e07b39", "number": "#5b7fc4", "object": "#3a9e6f"}
    n, nt = len(pts), len(common.FLIP_TYPES)
    fig, ax = plt.subplots(figsize=(max(7.0, 1.25 * n + 2.5), 5.2))
    width = 0.8 / nt
    x = np.arange(n)
    for j, t in enumerate(common.FLIP_TYPES):
        vals = [r[f"{t}_pos_rate"] for r in pts]
        lo = [r[f"{t}_pos_rate_ci_lo"] for r in pts]
        hi = [r[f"{t}_pos_rate_ci_hi"] for r in pts]
        err = None
        if all(v is None or (a is not None and b is not None) for v, a, b in zip(vals, lo, hi)):
            err = np.array([[0.0 if v is None else max(v - a, 0.0) for v, a in zip(vals, lo)],
                            [0.0 if v is None else max(b - v, 0.0) for v, b in zip(vals, hi)]])
        counts = {r[f"{t}_count"] for r in pts}
        label = t + (f" (n={counts.pop()})" if len(counts) == 1 and None not in counts else "")
        ax.bar(x + (j - (nt - 1) / 2) * width, [np.nan if v is None else v for v in vals], width * 0.92,
               yerr=err, capsize=3, color=palette.get(t), edgecolor="white", linewidth=0.6,
               error_kw=dict(ecolor="0.2", elinewidth=1.0), label=label, zorder=3)
    ax.axhline(0.5, color="0.3", linestyle="--", linewidth=1.2, zorder=4, label="chance (0.5)")
    ax.set_xticks(x)
    ax.set_xticklabels([r["label"] for r in pts], rotation=25 if n > 3 else 0, ha="right" if n > 3 else "center")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("Positive rate (higher is better)")
    ax.grid(True, axis="y", alpha=0.3, zorder=0)
    ax.set_title("LGIP sensitivity by flip type: share of flips scored below the original"
                 + (f"\n{title_note}" if title_note else ""), fontsize=13, pad=30)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=nt + 1, frameon=False)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------

def _runs_summary(metrics, paths):
    """Markdown lines describing each evaluation found."""
    header = ["Evaluation", "Metrics file", "Input", "Protocol", "Models", "Records in file",
              "Records evaluated", "Unreadable images"]
    cells, versions = [], {}
    for key in EVAL_KEYS:
        if key not in metrics:
            continue
        ms = metrics[key]
        runs = [m.get("run") or {} for m in ms]
        protocols = sorted({(r.get("model") or {}).get("protocol") or "?" for r in runs})
        inputs = sorted({(r.get("config") or {}).get("JSONL_PATH") or "?" for r in runs})
        in_file = sorted({str(r.get("num_records_in_file", "?")) for r in runs})
        evaluated = sorted({str((m.get("corrected") or {}).get("num_records", "?") if key == "enhanced"
                                else m.get("num_samples", "?")) for m in ms})
        failed = [r.get("num_failed_images") for r in runs if r.get("num_failed_images") is not None]
        cells.append([f"`{SCRIPTS[key]}`", f"`{os.path.basename(paths[key])}`",
                      ", ".join(f"`{os.path.basename(p)}`" if p != "?" else "?" for p in inputs),
                      ", ".join(protocols), str(len(ms)), ", ".join(in_file), ", ".join(evaluated),
                      str(max(failed)) if failed else "?"])
        for r in runs:
            if r.get("versions"):
                versions.setdefault(tuple(r["versions"].items()), []).append(key)
    lines = [md_table(header, cells)]
    for items, keys in versions.items():
        v = dict(items)
        which = "" if len(versions) == 1 else f" ({', '.join(dict.fromkeys(keys))})"
        lines.append(f"\nPackage versions{which}: " + ", ".join(f"{k} {val}" for k, val in v.items()))
    return "\n".join(lines)


def _top_tables(para_top, flip_top, k):
    parts = []
    para_rows = [(i + 1, row) for rows in para_top.values() for i, row in enumerate(rows)]  # ranked per bucket
    flip_rows = [(i + 1, row) for rows in flip_top.values() for i, row in enumerate(rows)]
    scope = "per model" if TOP_K_PER_MODEL else "over all models"
    parts.append(f"## Paraphrases that move the score most\n\nTop {k} {scope} by |Δ sim|, "
                 "Δ sim = sim(image, paraphrase) − sim(image, caption); an invariant model keeps it near 0.\n")
    if para_rows:
        parts.append(md_table(["#", "Model", "Image", "Caption", "Paraphrase", "Δ sim"],
                              [[i, f"`{r['model']}`", r["image"], _md_text(r["caption"], MAX_TEXT_CHARS),
                                _md_text(r["text"], MAX_TEXT_CHARS), f"{r['delta']:+.4f}"] for i, r in para_rows],
                              ["r", "l", "r", "l", "l", "r"]))
    else:
        parts.append("No paraphrase scores found.")
    parts.append(f"\n## Flips most preferred over their original\n\nTop {k} {scope} with gap < 0, "
                 "gap = sim(image, caption) − sim(image, flip): the model scores the wrong caption higher.\n")
    if flip_rows:
        parts.append(md_table(["#", "Model", "Image", "Caption", "Flip", "Type", "Gap"],
                              [[i, f"`{r['model']}`", r["image"], _md_text(r["caption"], MAX_TEXT_CHARS),
                                _md_text(r["text"], MAX_TEXT_CHARS), r.get("type") or "?", f"{r['gap']:+.4f}"]
                               for i, r in flip_rows],
                              ["r", "l", "r", "l", "l", "l", "r"]))
    else:
        parts.append("No flip was scored above its original.")
    return "\n".join(parts)


def _fmt_csv(v):
    if v is None:
        return ""
    return repr(v) if isinstance(v, float) else str(v)


def write_csv(path, rows):
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in rows:
        w.writerow([_fmt_csv(r[c]) for c in COLUMNS])
    with common.atomic_open(path) as f:
        f.write(buf.getvalue())


def _sources_note(rows, metrics, paths):
    notes = []
    heads = list(dict.fromkeys(r["headline_source"] for r in rows if r["headline_source"]))
    notes.append("Invariance error, gap and positive rate from " + ", ".join(
        f"`{SCRIPTS[h]}` (`{os.path.basename(paths[h])}`"
        + (f", {_enhanced_blocks(metrics[h][0])[2]} figures" if h == "enhanced" else "") + ")" for h in heads) + ".")
    typed = list(dict.fromkeys(r["flip_type_source"] for r in rows if r["flip_type_source"]))
    if typed:
        notes.append("Per-type positive rates from " + ", ".join(f"`{SCRIPTS[t]}`" for t in typed)
                     + (" (enhanced: corrected figures, no intervals)" if "enhanced" in typed else "") + ".")
    if "enhanced" in metrics:
        label = _enhanced_blocks(metrics["enhanced"][0])[2]
        notes.append(f"Simple/advanced invariance error" + (" and combined (paraphrase + flip) positive rate"
                     if label == "corrected" else "") + f" from `{SCRIPTS['enhanced']}`, {label} figures"
                     + (" (each flip counted once, `combined_caps` evaluated)." if label == "corrected"
                        else " (no `corrected` block: an older analysis file)."))
    notes.append("Invariance error = mean |sim(image, caption) − sim(image, paraphrase)|; gap = mean "
                 "sim(image, caption) − sim(image, flip); positive rate = share of flips with gap > 0 "
                 "(0.5 = chance). [lo, hi] = 95% bootstrap CI over images.")
    return "\n".join("- " + n for n in notes)


def _subtitle(stem, rows, source_column, figures):
    """'<stem> · <sources> · whiskers: 95% CI' for a figure's title, wrapped."""
    import textwrap
    sources = [SHORT_SOURCE[k] for k in EVAL_KEYS if any(r[source_column] == k for r in rows)]
    whiskers = any(r.get(f + "_ci_lo") is not None for r in rows for f in figures)
    text = " · ".join([stem, " + ".join(sources), "whiskers: 95% CI" if whiskers else "no intervals"])
    return "\n".join(textwrap.wrap(text, 70))


def main():
    found, looked = find_metrics(JSONL_PATH)
    if not found:
        raise common.InputError(f"no LGIP metrics found for {JSONL_PATH}; looked for:\n  " + "\n  ".join(looked)
                                + "\n(run run_lgip_multi.py, run_lgip_by_fliptype.py or "
                                  "rebuttal_enhanced_lgip_by_transformation.py first)")
    if SCORE_SOURCES is not None and not set(SCORE_SOURCES) <= set(EVAL_KEYS):
        raise common.InputError(f"unknown SCORE_SOURCES {SCORE_SOURCES!r}; valid: None or a list of {', '.join(EVAL_KEYS)}")
    metrics = {k: load_metrics(p) for k, p in found.items()}
    rows = build_rows(metrics, HEADLINE)
    prefix = OUTPUT_PREFIX or common.metrics_path(JSONL_PATH, "LGIP_")
    out = {name: prefix + name for name in ("report.md", "report.csv", "frontier.png", "fliptypes.png")}
    stem = os.path.splitext(os.path.basename(JSONL_PATH))[0]

    front = plot_frontier(rows, out["frontier.png"], _subtitle(stem, rows, "headline_source", ["invariance_error", "pos_rate"]))
    flip_png = plot_fliptypes(rows, out["fliptypes.png"], _subtitle(stem, rows, "flip_type_source",
                                                                    [f"{t}_pos_rate" for t in common.FLIP_TYPES]))
    write_csv(out["report.csv"], rows)

    para_top, flip_top, missing = {}, {}, []
    if TOP_K > 0:
        files, missing = score_files(metrics, found, SCORE_SOURCES)
        para_top, flip_top = scan_scores(files, TOP_K, TOP_K_PER_MODEL)

    header, cells, align = main_table(rows)
    table = md_table(header, cells, align)
    md_dir = os.path.dirname(os.path.abspath(out["report.md"]))
    md = [f"# LGIP report: {stem}", "",
          f"Input: `{os.path.abspath(JSONL_PATH)}`  ",
          "Models: " + ", ".join(f"`{r['model']}`" for r in rows) + "  ",
          "Protocol: " + ", ".join(sorted({r["protocol"] or "unknown (no run info)" for r in rows})), "",
          _runs_summary(metrics, found), "", "## Results", "", table, "", _sources_note(rows, metrics, found), ""]
    if front is not None:
        md.append("Pareto frontier (no other model has both a lower invariance error and a higher positive rate): "
                  + ", ".join(f"`{m}`" for m in front) + ".\n")
    for png, alt in ((out["frontier.png"] if front is not None else None, "Invariance error against positive rate"),
                     (flip_png, "Positive rate by flip type")):
        if png:
            md.append(f"![{alt}]({os.path.relpath(os.path.abspath(png), md_dir)})\n")
    if TOP_K > 0:
        md.append(_top_tables(para_top, flip_top, TOP_K))
        if missing:
            md.append("\nScore files listed in the metrics but missing: "
                      + ", ".join(dict.fromkeys(f"`{os.path.basename(p)}`" for _, _, p in missing)) + ".")
    prov = common.provenance(__file__, CONFIG)
    try:
        from importlib import metadata
        prov["versions"]["matplotlib"] = metadata.version("matplotlib")
    except Exception:  # the version is only informative
        pass
    settings = ", ".join(f"{k}={v!r}" for k, v in prov["config"].items() if k != "JSONL_PATH")
    md += ["", "---", f"<sub>Made by `{prov['script']}` on {prov['created']} ({settings}; "
           + ", ".join(f"{k} {v}" for k, v in prov["versions"].items()) + ").</sub>", ""]
    with common.atomic_open(out["report.md"]) as f:
        f.write("\n".join(md))

    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="replace")  # the table has arrows and dashes
    print(table)
    print()
    for name in ("report.md", "report.csv", "frontier.png", "fliptypes.png"):
        if name == "fliptypes.png" and flip_png is None:
            print(f"(no per-type metrics: {os.path.basename(out[name])} not written)")
        elif name == "frontier.png" and front is None:
            print(f"(no headline metrics: {os.path.basename(out[name])} not written)")
        else:
            print(f"-> {out[name]}")


if __name__ == "__main__":
    common.run_main(main)
