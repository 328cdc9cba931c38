"""lgip.compare: two runs' figures on the same input, paired over the images both scored (`lgip compare RUN_A
RUN_B`: a model before and after a week of training, two checkpoints, two protocols), with LGIP_SPEC.md section 9's
paired bootstrap (lgip.controls.Comparisons: diff = A - B and its interval from BOOTSTRAP resamples of the shared
images with replacement, seed BOOTSTRAP_SEED, the SAME drawn images for both runs).

RUN_A, RUN_B: an evaluation's output folder, or one of its metrics files (lgip.export.find_scored). The figures are
recomputed from each model's score file (`*.scores.jsonl`, similarities to 6 decimals), over the images both runs
scored, matched on (line, image_path): invariance error, sensitivity gap and positive rate (and grounded positive
rate where the score file has the text prior), per flip type too; the enhanced analysis's combined texts; the
image side's figures per alteration. Evaluations pair by script (and input stem, where a folder holds several);
models by name, or, where each run has one model, those two; `--A=` and `--B=` name them otherwise. A line per
figure, `figure [type]: A a, B b, diff d [lo, hi]`, and `<stem>__LGIP_compare.metrics.json` in the working folder
(OUTPUT elsewhere): the comparisons' rows as section 9's file holds them (`a`, `b` each a model and its run),
merged with earlier comparisons' (lgip.results), so no comparison of other runs is lost.

    >>> compare("runs/before", "runs/after")          # the rows, each printed as a line
"""

import os

import numpy as np

from .controls import Comparisons
from .errors import ConfigError, InputError

DEFAULTS = {"A": None, "B": None, "BOOTSTRAP": 1000, "BOOTSTRAP_SEED": 0, "OUTPUT": None}
RATES = ("pos_rate",)  # (figures printed with 3 decimals; the others, in a score's units, with 4)


class _Paired(Comparisons):
    IN_UNITS = ("invariance_error_mean", "sensitivity_gap_mean", "image_invariance_error_mean")
    IN_UNITS += ("image_sensitivity_gap_mean",)  # (in the score's units: compared only between one score_kind)


def per_image_values(score_file, model):
    """{(figure, type or None): ([image key (line, image_path)], [value])} of a score file's pairs."""
    from .scorefile import COLUMNS, EXTRA_COLUMNS, iter_pairs

    out = {}

    def add(figure, kind_type, key, value):
        for t in (None, kind_type) if kind_type is not None else (None,):
            keys, values = out.setdefault((figure, t), ([], []))
            keys.append(key)
            values.append(value)

    names = COLUMNS + EXTRA_COLUMNS
    for values in iter_pairs(score_file, model):
        row = dict(zip(names, values))
        if row["kind"] == "caption" or row["gap"] is None:
            continue
        key, gap, kind, t = (row["line"], row["image_path"]), row["gap"], row["kind"], row["type"]
        if kind == "paraphrase":
            add("invariance_error_mean", t, key, abs(gap))
        elif kind == "flip":
            add("sensitivity_pos_rate", t, key, float(gap > 0))
            add("sensitivity_gap_mean", t, key, gap)
            if row["prior_gap"] is not None:  # (section 9: the caption beats the flip by more on its own image)
                add("grounded_pos_rate", t, key, float(gap - row["prior_gap"] > 0))
        elif kind == "combined":
            add("combined_pos_rate", t, key, float(gap > 0))
        elif kind == "image_paraphrase":
            add("image_invariance_error_mean", t, key, abs(gap))
        elif kind == "image_flip":
            add("image_sensitivity_pos_rate", t, key, float(gap > 0))
            add("image_sensitivity_gap_mean", t, key, gap)
    return out


def _pick_models(a, b, config, run_a, run_b):
    """[(row of A, row of B)]: --A=/--B= when given, else the models of one name in both, else the one model of
    each; a ConfigError naming each run's models otherwise."""
    names_a, names_b = [r["model_tag"] for r in a.rows], [r["model_tag"] for r in b.rows]
    want_a, want_b = config.get("A"), config.get("B")
    if want_a is not None or want_b is not None:  # (one alone: the other run's model of that name, or its one)
        one = lambda want, names: want if want in names or len(names) != 1 else names[0]
        want_a, want_b = want_a or one(want_b, names_a), want_b or one(want_a, names_b)
        for want, names, run, side in ((want_a, names_a, run_a, "A"), (want_b, names_b, run_b, "B")):
            if want not in names:
                from .cli import closest

                raise ConfigError(
                    f"{side}={want!r}: no such model in {run}'s {a.key} rows{closest(want, names)}; "
                    f"its models: {', '.join(names)}"
                )
        return [(a.rows[names_a.index(want_a)], b.rows[names_b.index(want_b)])]
    common = [n for n in names_a if n in names_b]
    if common:
        return [(a.rows[names_a.index(n)], b.rows[names_b.index(n)]) for n in common]
    if len(names_a) == 1 and len(names_b) == 1:
        return [(a.rows[0], b.rows[0])]
    raise ConfigError(
        f"{a.key}: the runs have no model of one name ({run_a}: {', '.join(names_a)}; {run_b}: "
        f"{', '.join(names_b)}): name the two to compare with --A=<a model of RUN_A> --B=<a model of RUN_B>"
    )


def _score_file(scored, row, run):
    path = scored.score_file(row)
    if path is None:
        why = (
            "its evaluation wrote none (WRITE_SCORES=False)"
            if row.get("scores_file") is None
            else f"{os.path.join(scored.folder, row['scores_file'])} is not there"
        )
        raise InputError(
            f"{run}: {row['model_tag']}'s score file of {scored.script}: {why}; the comparison pairs the images "
            f"through the score files: run {scored.script} again with WRITE_SCORES=True"
        )
    return path


def _pairs_of_evaluations(found_a, found_b, run_a, run_b):
    """[(Scored of A, Scored of B)]: one evaluation of each run, by script (and input stem where a run holds the
    same script on several inputs)."""
    out = []
    for a in found_a:
        same = [b for b in found_b if b.script == a.script]
        if len(same) > 1 or sum(x.script == a.script for x in found_a) > 1:
            same = [b for b in same if b.stem == a.stem]
        if same:
            out.append((a, same[0]))
    if not out:
        raise InputError(
            f"{run_a} and {run_b} have no evaluation in common (A: {', '.join(sorted({s.script for s in found_a}))}; "
            f"B: {', '.join(sorted({s.script for s in found_b}))})"
        )
    return out


def _fmt(figure, v):
    return f"{v:.3f}" if any(figure.endswith(r) for r in RATES) else f"{v:.4f}"


def line(row):
    """'figure [type]: A a, B b, diff d [lo, hi]' (the type left out for the overall figure)."""
    figure, t = row["figure"], row["flip_type"]
    head = figure + (f" [{t}]" if t is not None else "")
    if row["diff"] is None:
        return f"{head}: n/a (no pair of one run on the images drawn)"
    f = lambda v: _fmt(figure, v)
    ci = row["diff_ci95"]
    sign = lambda v: ("+" if v >= 0 else "") + f(v)
    return f"{head}: A {f(row['a_value'])}, B {f(row['b_value'])}, diff {sign(row['diff'])}" + (
        f" [{sign(ci[0])}, {sign(ci[1])}]" if ci else ""
    )


def _in_order(rows):
    """The overall figures first, then each type's (types and figures in the order the score file gives them)."""
    figures = list(dict.fromkeys(r["figure"] for r in rows))
    types = list(dict.fromkeys(r["flip_type"] for r in rows if r["flip_type"] is not None))
    at = lambda r: (0 if r["flip_type"] is None else 1 + types.index(r["flip_type"]), figures.index(r["figure"]))
    return sorted(rows, key=at)


def base_stem(stem):
    """The base JSONL's stem of an evaluation's input stem (x_with_fliptypes -> x), as the report's file is named."""
    stem = stem[len("rebuttal_enhanced_") :] if stem.startswith("rebuttal_enhanced_") else stem
    for suffix in ("_with_perturb", "_with_fliptypes"):
        if stem.endswith(suffix):
            return stem[: -len(suffix)]
    return stem


def compare(run_a, run_b, config=None):
    """The comparisons of RUN_A and RUN_B (rows as LGIP_SPEC.md 9's file holds them, with the runs and models), each
    printed as a line; written to the compare file. InputError when they share no image or a score file lacks."""
    from .export import find_scored
    from .results import write_rows
    from .settings import setting
    from .util import provenance

    config = dict(DEFAULTS, **(config or {}))
    resamples, seed = setting(config, "BOOTSTRAP"), setting(config, "BOOTSTRAP_SEED")
    found_a, found_b = find_scored(run_a), find_scored(run_b)
    rows, stems = [], []
    for a, b in _pairs_of_evaluations(found_a, found_b, run_a, run_b):
        for row_a, row_b in _pick_models(a, b, config, run_a, run_b):
            va = per_image_values(_score_file(a, row_a, run_a), row_a["model_tag"])
            vb = per_image_values(_score_file(b, row_b, run_b), row_b["model_tag"])
            images_a = {k for keys, _ in va.values() for k in keys}
            images_b = {k for keys, _ in vb.values() for k in keys}
            shared = sorted(images_a & images_b, key=lambda k: (k[0], str(k[1])))
            if not shared:
                raise InputError(
                    f"{run_a} and {run_b} share no image of {a.script} (matched on line and image_path): "
                    f"A's {row_a['model_tag']} scored {len(images_a)} image(s) of {a.stem}, B's {row_b['model_tag']} "
                    f"{len(images_b)} of {b.stem}; compare runs on the same input"
                )
            index = {k: i for i, k in enumerate(shared)}
            paired = _Paired()
            for side, values, row in (("A", va, row_a), ("B", vb, row_b)):
                for (figure, t), (keys, vals) in values.items():
                    keep = [j for j, k in enumerate(keys) if k in index]
                    rec = np.array([index[keys[j]] for j in keep], dtype=np.int64)
                    paired.add(
                        side, figure, t, rec, np.array([vals[j] for j in keep]), score_kind=row.get("score_kind")
                    )
            ma, mb = row_a["model_tag"], row_b["model_tag"]
            print(
                f"{a.script}: A {ma} ({run_a}), B {mb} ({run_b}): {len(shared)} image(s) both scored "
                f"(A {len(images_a)}, B {len(images_b)}); diff = A - B, 95% interval over the shared images",
                flush=True,
            )
            for r in _in_order(paired.rows(a.script, resamples, seed)):
                print("  " + line(r), flush=True)
                r.update(a=f"{ma} ({os.path.abspath(run_a)})", b=f"{mb} ({os.path.abspath(run_b)})")
                r.update(model_a=ma, model_b=mb, run_a=os.path.abspath(run_a), run_b=os.path.abspath(run_b))
                r["run"] = provenance("lgip compare", config)
                rows.append(r)
            stems.append(base_stem(a.stem))
    path = config.get("OUTPUT") or os.path.join(os.getcwd(), f"{stems[0]}__LGIP_compare.metrics.json")
    written = write_rows(path, rows)
    print(f"-> {written}", flush=True)
    return rows


USAGE = """usage: lgip compare RUN_A RUN_B [--A=<model of RUN_A>] [--B=<model of RUN_B>] [--BOOTSTRAP=1000]
                    [--BOOTSTRAP_SEED=0] [--OUTPUT=<file>]

  RUN_A, RUN_B: two runs' output folders (or metrics files) on the same input. A line per figure:
  figure [type]: A a, B b, diff d [lo, hi]    (diff = A - B; LGIP_SPEC.md 9's paired bootstrap over the images
  both scored); also <stem>__LGIP_compare.metrics.json in the working folder (--OUTPUT= elsewhere)."""


def main(argv):
    """`lgip compare ...`: its exit status (2: bad input, named; 4: an output that cannot be written)."""
    from .cli import command_settings, exit_status

    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0

    def work():
        runs, config = command_settings("compare", argv, DEFAULTS, USAGE)
        if len(runs) != 2:
            raise ConfigError(f"lgip compare takes two runs, RUN_A and RUN_B, got {len(runs)}\n{USAGE}")
        compare(runs[0], runs[1], config)

    return exit_status(work, step=True)
