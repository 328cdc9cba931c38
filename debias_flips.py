"""debias_flips: a copy of a perturbation set whose flips the chosen text-only scorers cannot tell from their
captions (after SugarCrepe's adversarial refinement), and a held-out scorer's figures before and after.

LGIP_SPEC.md section 15. Reads blind_audit.py's gaps for JSONL_PATH (run it first). In each cell of flip type
and |gap| bins of the DEBIAS_SCORERS, pairs of mirrored sign patterns are kept in equal numbers, so each of
those scorers is at chance on what is kept (that validates nothing by itself); the HELD_OUT scorers, never
used for debiasing, say how blind-solvable the kept flips still are. Writes `<stem>_debiased.jsonl` beside the
input (every record, only its kept flips: a valid input of every evaluation) with its meta file, and
`<stem>__LGIP_debias.metrics.json` (beside the input, or in OUTPUT_DIR).
  python blind_audit.py --JSONL_PATH=lgip_coco_native5_train2017_with_fliptypes.jsonl
  python debias_flips.py --JSONL_PATH=lgip_coco_native5_train2017_with_fliptypes.jsonl
  python run_lgip_by_fliptype.py --JSONL_PATH=lgip_coco_native5_train2017_with_fliptypes_debiased.jsonl
"""

import json
import os

import common
from lgip import blind, blind_scorers, debias

_HERE = os.path.dirname(os.path.abspath(__file__))
JSONL_PATH = os.path.join(_HERE, "lgip_coco_native5_train2017_with_fliptypes.jsonl")  # input: the records
#   blind_audit.py audited (its gaps are read)
OUTPUT_DIR = None  # folder for the metrics (and where blind_audit.py wrote its own), created when missing;
#   None = beside JSONL_PATH (the debiased records are always written beside the input)
DEBIAS_SCORERS = ["length", "ngram1", "ngram3"]  # list of blind_audit.py scorers balanced to chance
HELD_OUT = ["edit"]  # list of blind_audit.py scorers never used for debiasing, measured before and after
BINS = 5  # int >= 1: |gap| bins per debiasing scorer (by quantile of its non-zero gaps)
SEED = 0  # int: which pairs of a larger group are kept (a seeded hash of each pair)
BOOTSTRAP = 1000  # int >= 0: bootstrap resamples of the images for the *_ci95 fields; 0 = no intervals
BOOTSTRAP_SEED = 0  # int: seed of the bootstrap resampling
VERBOSE = True  # True: every line (paths written, notes); False: the result lines (run_all's default)
CONFIG = common.configure(globals())


def check_config():
    for name in ("DEBIAS_SCORERS", "HELD_OUT"):
        value = CONFIG[name]
        if not isinstance(value, (list, tuple)) or not all(isinstance(s, str) for s in value):
            raise common.ConfigError(f"{name} must be a list of blind_audit.py scorer names, got {value!r}")
    if not DEBIAS_SCORERS:
        raise common.ConfigError("DEBIAS_SCORERS is empty: name at least one scorer to balance (e.g. ['length'])")
    both = [s for s in HELD_OUT if s in DEBIAS_SCORERS]
    if both:
        raise common.ConfigError(
            f"HELD_OUT {both} is also in DEBIAS_SCORERS: a held-out scorer is never used for debiasing (at chance "
            f"by construction, it would validate nothing)"
        )
    common.require_int(CONFIG, "BINS", 1)
    common.require_int(CONFIG, "SEED")


def read_audit(records, pairs, sha):
    """blind_audit.py's gaps for this input: {scorer: [g or None per pair]}, checked."""
    path, lines_path = common.blind_file(JSONL_PATH, "metrics"), common.blind_file(JSONL_PATH, "gaps")
    run = (
        f'python blind_audit.py --JSONL_PATH={JSONL_PATH} --SCORERS="{list(dict.fromkeys(DEBIAS_SCORERS + HELD_OUT))}"'
    )
    if not (os.path.isfile(path) and os.path.isfile(lines_path)):
        raise common.InputError(f"no blind audit of {JSONL_PATH} ({path} missing): run first\n  {run}")
    with open(path, encoding="utf-8") as f:
        meta = json.load(f)
    if meta.get("input_sha256") != sha:
        raise common.InputError(
            f"{path} audits another version of {JSONL_PATH} (its input_sha256 differs): run again\n  {run}"
        )
    there = [s["name"] for s in meta.get("scorers", [])]
    missing = [s for s in DEBIAS_SCORERS + HELD_OUT if s not in there]
    if missing:
        import difflib

        close = [c for s in missing for c in difflib.get_close_matches(s, there, n=1)]
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        raise common.InputError(f"{path} has no {', '.join(missing)}{hint} (it has {', '.join(there)}): run\n  {run}")
    return blind_scorers.read_gaps(lines_path, pairs, DEBIAS_SCORERS + HELD_OUT, run)


def main():
    check_config()
    sha = common.file_sha256(JSONL_PATH)
    records = common.load_records(JSONL_PATH, ("diff_caps", "diff_caps_*"))
    pairs, types = blind.blind_pairs(records)
    gaps = read_audit(records, pairs, sha)
    keep, edges, unscored = debias.balance(pairs, {s: gaps[s] for s in DEBIAS_SCORERS}, BINS, SEED)
    at = {(p.r, p.i, p.t, p.j): x for x, p in enumerate(pairs)}
    output = common.default_output(JSONL_PATH, "_debiased.jsonl")
    common.refuse_overwriting_input(output, JSONL_PATH)
    raw = [json.loads(line) for line in open(JSONL_PATH, encoding="utf-8-sig") if line.strip()]
    out_records, untyped = [], 0
    for r, rec in enumerate(raw):
        new, dropped = debias.debiased_record(rec, r, at, keep, types)
        out_records.append(new)
        untyped += dropped
    kept = debias.kept_blocks(pairs, keep, unscored, types)
    figures = lambda idx: {
        s: blind.blind_figures([pairs[x] for x in idx], [gaps[s][x] for x in idx], types, BOOTSTRAP, BOOTSTRAP_SEED)
        for s in DEBIAS_SCORERS + HELD_OUT
    }
    chosen = [x for x in range(len(pairs)) if keep[x]]
    metrics = {
        "input": os.path.abspath(JSONL_PATH),
        "output": os.path.abspath(output),
        "debias_scorers": list(DEBIAS_SCORERS),
        "held_out": list(HELD_OUT),
        "bins": BINS,
        "seed": SEED,
        "edges": edges,
        "kept": kept,
        "before": figures(range(len(pairs))),
        "after": figures(chosen),
        "run": common.provenance(__file__, CONFIG),
    }
    meta = dict(common.provenance(__file__, CONFIG), input=os.path.abspath(JSONL_PATH), input_sha256=sha)
    meta.update(edges=edges, kept=kept, untyped_dropped=untyped)
    metrics_file = common.blind_file(JSONL_PATH, "debias")
    with common.OutputSet() as files:  # (the records, their meta and the metrics: all, or none)
        with files.open(output) as f:
            f.writelines(common.dump_jsonl_line(rec) for rec in out_records)
        common.write_json(output + ".meta.json", meta, files=files)
        common.write_json(metrics_file, metrics, files=files)
    say(metrics, untyped)
    common.detail(f"-> {output}\n-> {metrics_file}")
    return metrics


def say(m, untyped):
    f = lambda v: common.fmt(v, ".3f")
    kept = ", ".join(f"{t} {b['kept']:,} of {b['count']:,}" for t, b in m["kept"].items() if t != "all")
    print(f"debiased: kept {m['kept']['all']['kept']:,} of {m['kept']['all']['count']:,} flips ({kept})", flush=True)
    for s in m["held_out"]:
        before, after = m["before"][s]["all"], m["after"][s]["all"]
        ci = lambda b: f" [{f(b['acc_untied_ci95'][0])}, {f(b['acc_untied_ci95'][1])}]" if b["acc_untied_ci95"] else ""
        print(
            f"  held out {s}: acc_untied {f(before['acc_untied'])}{ci(before)} -> {f(after['acc_untied'])}{ci(after)}"
        )
    few = [
        t for t, b in m["kept"].items() if t != "all" and b["kept_fraction"] is not None and b["kept_fraction"] < 0.1
    ]
    for t in few:  # (few kept: the debiasing scorers found few mirrored pairs; say what each did there before)
        b = m["kept"][t]
        sides = {s: blind.side_of_chance(m["before"][s][t]) for s in m["debias_scorers"]}
        away = [f"{s} {side} chance" for s, side in sides.items() if side in ("above", "below")]
        why = f"blind-solvable ({', '.join(away)})" if away else "no debiasing scorer is told from chance on them"
        print(f"  warning: {t}: {b['kept']:,} of {b['count']:,} flips kept (under 10%): {why}; before debiasing:")
        for s in m["debias_scorers"]:
            print(f"    {s}: {blind.standing(m['before'][s][t])}")
    if untyped:
        common.detail(f"  {untyped} diff_caps entries in no typed list dropped")


def run(**constants):
    """The command line's run, and a call from Python: the constants as keyword arguments (lgip.entry);
    returns the metrics it wrote."""
    with common.script_call(globals(), constants):
        return main()


if __name__ == "__main__":
    common.run_main(run)
