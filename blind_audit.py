"""blind_audit: is the probe blind-solvable? For each flip type, how often a scorer that never sees the image
picks the caption over its flip: a word-length rule, cross-fitted n-gram models of the captions and a model of
the generator's edit words (SugarCrepe's lesson: rule-made negatives are often told apart by text alone).

LGIP_SPEC.md section 15. Reads any records file with flips (`<stem>_with_fliptypes.jsonl`, `_with_perturb`,
an imported benchmark's); reads no image. Each pair is scored by models fit on the other folds' records only
(folds by image), so a model never sees the captions of the image it judges. Writes
`<stem>__LGIP_blind.metrics.json` (per scorer and type: acc, acc_untied with intervals over images) and
`<stem>__LGIP_blind.gaps.jsonl` (a line per pair, each scorer's gap), beside the input or in OUTPUT_DIR.
  python blind_audit.py --JSONL_PATH=lgip_coco_native5_train2017_with_fliptypes.jsonl
  python blind_audit.py --SCORERS="['length', 'ngram3']" --FOLDS=10
"""

import os

import common
from lgip import blind, blind_scorers

_HERE = os.path.dirname(os.path.abspath(__file__))
JSONL_PATH = os.path.join(_HERE, "lgip_coco_native5_train2017_with_fliptypes.jsonl")  # input: records with flips
#   (make_perturb_with_fliptypes.py's, make_perturb's, import_benchmark.py's)
OUTPUT_DIR = None  # folder for the outputs, created when missing; None = beside JSONL_PATH
SCORERS = ["length", "ngram1", "ngram3", "edit"]  # list of "length", "ngram<n>" (n = 1..5), "edit",
#   "prior:<model_tag>" (that model's prior gaps, from its score file of this input) or causal_lm specs
#   ({"name", "type": "causal_lm", "model_id", "score": "logprob" or "logprob_mean"}: named lm:<name>)
FOLDS = 5  # int >= 2: folds by image; a pair is scored by models fit on the other folds
NGRAM_CORPUS = None  # None, or a UTF-8 file of captions (one a line) added to every fold's corpus (for small
#   inputs); a line whose words equal a caption's of the input is dropped and counted
DEVICE = "auto"  # "auto" (cuda if available), "cpu", "cuda", "cuda:1", ...: where a causal_lm scorer runs
DTYPE = "auto"  # "auto" (bf16 on CUDA, fp32 on CPU), "fp32", "bf16", "fp16": a causal_lm scorer's
TEXT_BATCH_SIZE = 32  # int >= 1: texts per forward pass of a causal_lm scorer
CACHE_DIR = "auto"  # a causal_lm scorer's cache folder; "auto" = .lgip_cache beside the input (or in OUTPUT_DIR),
#   the evaluations' own (a re-run reads its scores and loads no weights); None = no cache
BOOTSTRAP = 1000  # int >= 0: bootstrap resamples of the images for the *_ci95 fields; 0 = no intervals
BOOTSTRAP_SEED = 0  # int: seed of the bootstrap resampling
VERBOSE = True  # True: every line (paths written, notes); False: the result lines (run_all's default)
CONFIG = common.configure(globals())


def check_config():
    scorers = blind_scorers.check_scorers(SCORERS)  # (one table of the forms: lgip.blind_scorers)
    common.require_int(CONFIG, "TEXT_BATCH_SIZE", 1)
    common.require_int(CONFIG, "FOLDS", 2)
    if NGRAM_CORPUS is not None and not (isinstance(NGRAM_CORPUS, str) and os.path.isfile(NGRAM_CORPUS)):
        raise common.InputError(f"NGRAM_CORPUS={NGRAM_CORPUS!r} is not a file: give a UTF-8 file of captions or None")
    return scorers


def audit():
    scorers = check_config()
    with common.Timer() as t:
        records = common.load_records(JSONL_PATH, ("diff_caps", "diff_caps_*"))
        pairs, types = blind.blind_pairs(records)
        if not pairs:
            raise common.InputError(
                f"no pair to audit: {len(records)} records in {JSONL_PATH}, no caption with a flip (diff_caps"
                f"{', diff_caps_<type>' if types != ['all'] else ''}); nothing was written"
            )
        extra, dropped = blind.corpus_lines(NGRAM_CORPUS, records) if NGRAM_CORPUS else ([], 0)
        folds = [blind.fold_of(rec, FOLDS) for _, rec in records]
        job = blind_scorers.Audit(JSONL_PATH, records, pairs, types, folds, FOLDS, CONFIG, tuple(extra))
        gaps = blind_scorers.all_gaps(scorers, job)
        by_scorer = {name: blind.blind_figures(pairs, g, types, BOOTSTRAP, BOOTSTRAP_SEED) for name, g in gaps.items()}
    metrics = {
        "input": os.path.abspath(JSONL_PATH),
        "input_sha256": common.file_sha256(JSONL_PATH),
        "num_records": len(records),
        "num_pairs": len(pairs),
        "types": types,
        "folds": [folds.count(k) for k in range(FOLDS)],
        "corpus_lines": len(extra),
        "corpus_lines_dropped": dropped,
        "scorers": [form.block(entry, FOLDS) for entry, form, _ in scorers],
        "by_scorer": by_scorer,
        "settings": {k: CONFIG[k] for k in ("SCORERS", "FOLDS", "NGRAM_CORPUS", "BOOTSTRAP", "BOOTSTRAP_SEED")},
        "run": dict(common.provenance(__file__, CONFIG), seconds=round(t.seconds, 3)),
    }
    path, lines_path = common.blind_file(JSONL_PATH, "metrics"), common.blind_file(JSONL_PATH, "gaps")
    with common.OutputSet() as files:  # (the metrics and the gaps: both, or neither)
        with files.open(lines_path) as f:
            blind_scorers.write_gaps(f, job, gaps)
        common.write_json(path, metrics, files=files)
    say(metrics, t.seconds)
    common.detail(f"-> {path}\n-> {lines_path}")
    return metrics


def say(metrics, seconds):
    """One line: each scorer's acc_untied over all flips; with VERBOSE a line per scorer with its interval,
    ties and each type's."""
    f = lambda v: common.fmt(v, ".3f")
    by = metrics["by_scorer"]
    print(
        f"blind audit: {metrics['num_pairs']:,} pairs of {metrics['num_records']:,} records, acc_untied (chance "
        f"0.5): "
        + ", ".join(f"{name} {f(blocks['all']['acc_untied'])}" for name, blocks in by.items())
        + f" ({seconds:.1f} s)",
        flush=True,
    )
    for name, blocks in by.items():
        ci = blocks["all"]["acc_untied_ci95"]
        per_type = ", ".join(f"{t} {f(b['acc_untied'])}" for t, b in blocks.items() if t != "all")
        common.detail(
            f"  {name}: acc_untied {f(blocks['all']['acc_untied'])}"
            + (f" [{f(ci[0])}, {f(ci[1])}]" if ci else "")
            + f", ties {f(blocks['all']['tie_rate'])}"
            + (f" ({per_type})" if per_type else ""),
            flush=True,
        )


def run(**constants):
    """The command line's run, and a call from Python: the constants as keyword arguments (lgip.entry);
    returns the metrics it wrote."""
    with common.script_call(globals(), constants):
        return audit()


if __name__ == "__main__":
    common.run_main(run)
