"""lgip.blind_scorers: blind_audit.py's scorers, one table (LGIP_SPEC.md 15), and the gaps file they fill.

`BLIND_FORMS` is the one place a SCORERS entry is recognised: each form says which entries it takes, its name,
its block in the metrics' `scorers` list and its gaps (g = s(caption) - s(flip) per pair of lgip.blind.blind_pairs,
None where it has none). The text rules are lgip.blind's; `lm:<name>` is any model whose scorer reads no image
(lgip.scorers: type causal_lm's), scored through the evaluations' seam (lgip.evaluation.ModelRun: its scorer with
the model's cache around it, so a re-run reads its scores and loads no weights); `prior:<tag>` a model's prior
gaps read from its score file (lgip.scorefile.iter_score_lines). The gaps file (`<stem>__LGIP_blind.gaps.jsonl`,
a line per pair) is written and read here alone (`write_gaps`, `read_gaps`).

    >>> form = form_of("ngram3"); form.name("ngram3"), form.block("ngram3", 5)
    ('ngram3', {'name': 'ngram3', 'kind': 'ngram', 'settings': {'n': 3, 'folds': 5}})
"""

import collections
import difflib
import os
import re
from dataclasses import dataclass
from typing import Callable

from . import blind
from .errors import ConfigError, InputError
from .filenames import score_file
from .records import dump_jsonl_line


@dataclass
class Audit:
    """What a blind scorer works with: the input, its records and pairs, the folds, and the script's settings
    (a model scorer's DEVICE, DTYPE, TEXT_BATCH_SIZE, CACHE_DIR, OUTPUT_DIR)."""

    jsonl_path: str
    records: list  # [(line, record)]
    pairs: list  # lgip.blind.Pair, in blind_pairs' order
    types: list
    folds: list  # each record's fold
    n_folds: int
    config: dict
    extra: tuple = ()  # NGRAM_CORPUS's lines, added to every fold's corpus
    corpora: object = None  # the n-gram models' corpora per fold (made once, for every n-gram scorer)


@dataclass(frozen=True)
class BlindForm:
    """One form of SCORERS entry: `takes(entry)`, its `name(entry)`, its `kind` and `settings(entry, folds)` (the
    metrics' block), its `gaps(entry, audit)`; `needs_corpora`: fit on the other folds' captions."""

    kind: str
    takes: Callable
    settings: Callable
    gaps: Callable
    name: Callable = str
    needs_corpora: bool = False

    def block(self, entry, folds):
        return {"name": self.name(entry), "kind": self.kind, "settings": self.settings(entry, folds)}


def _lm_model(entry):
    """A SCORERS dict: a model spec whose scorer reads no image (lgip.scorers.gives), checked as MODELS are."""
    from .scorers import gives
    from .settings import check_models

    check_models([entry], "SCORERS")
    if not gives(entry, ("scores",)) or gives(entry, ("images",)):
        raise ConfigError(
            f"SCORERS: {entry.get('name')!r}: a model scorer reads the text alone (a blind model: type causal_lm), "
            f"and this one reads images; give it to the evaluations instead"
        )
    return True


def _ngram_gaps(entry, audit):
    return blind.ngram_gaps(audit.pairs, audit.corpora, audit.folds, int(entry[len("ngram") :]))


BLIND_FORMS = (
    BlindForm("length", lambda e: e == "length", lambda e, f: {}, lambda e, a: blind.length_gaps(a.pairs)),
    BlindForm(
        "ngram",
        lambda e: isinstance(e, str) and re.fullmatch(r"ngram[1-5]", e) is not None,
        lambda e, f: {"n": int(e[len("ngram") :]), "folds": f},
        _ngram_gaps,
        needs_corpora=True,
    ),
    BlindForm(
        "edit",
        lambda e: e == "edit",
        lambda e, f: {"folds": f},
        lambda e, a: blind.edit_gaps(a.pairs, a.folds, a.n_folds),
    ),
    BlindForm(
        "prior",
        lambda e: isinstance(e, str) and e.startswith("prior:") and len(e) > len("prior:"),
        lambda e, f: {"model_tag": e[len("prior:") :]},
        lambda e, a: prior_gaps(e[len("prior:") :], a),
    ),
    BlindForm(
        "lm",
        lambda e: isinstance(e, dict) and _lm_model(e),
        lambda e, f: {k: v for k, v in e.items() if k != "name"},
        lambda e, a: lm_gaps(e, a),
        name=lambda e: f"lm:{e.get('name')}",
    ),
)
NAMED = ("length", "ngram1", "ngram2", "ngram3", "ngram4", "ngram5", "edit")  # the forms named by a plain word
VALID = f"{', '.join(NAMED)}, prior:<model_tag>, or a causal_lm spec"


def form_of(entry):
    """The BlindForm that takes a SCORERS entry; ConfigError naming the closest valid name otherwise."""
    for form in BLIND_FORMS:
        if form.takes(entry):
            return form
    if isinstance(entry, str) and re.fullmatch(r"ngram\d+", entry):
        raise ConfigError(f"SCORERS: {entry!r}: an n-gram model's n is 1 to 5")
    close = difflib.get_close_matches(str(entry), NAMED, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(f"SCORERS: unknown scorer {entry!r}{hint}; valid: {VALID}")


def check_scorers(entries):
    """SCORERS checked, each entry once, before any work. Returns [(entry, its form, its name)]."""
    if not isinstance(entries, (list, tuple)) or not entries:
        raise ConfigError(f"SCORERS must be a non-empty list of scorer names ({VALID}), got {entries!r}")
    out, seen = [], set()
    for entry in entries:
        form = form_of(entry)
        name = form.name(entry)
        if name in seen:
            raise ConfigError(f"SCORERS: {name!r} is named twice")
        seen.add(name)
        out.append((entry, form, name))
    return out


def all_gaps(scorers, audit):
    """{name: gaps} of each checked scorer (check_scorers'), the n-gram corpora made once when one needs them."""
    if audit.corpora is None and any(form.needs_corpora for _, form, _ in scorers):
        audit.corpora = blind.fold_corpora(audit.records, audit.folds, audit.n_folds, list(audit.extra))
    return {name: form.gaps(entry, audit) for entry, form, name in scorers}


def lm_gaps(spec, audit):
    """`lm:<name>`: each text's score by a model that reads no image, through its scorer and the model's cache
    (lgip.evaluation.ModelRun, as an evaluation scores it: a re-run reads every text from the cache, loads no
    weights and says so); g = s(caption) - s(flip)."""
    from .evaluation import ModelRun

    pairs = audit.pairs

    def build(records, ks, calls):  # (one Pairs in blind_pairs' order: each caption then its flips of a type)
        from .scoring import Pairs

        out, at = Pairs(), 0
        while at < len(pairs):
            p = pairs[at]
            caption = calls.add_call([p.caption])[0]
            end = at
            while end < len(pairs) and (pairs[end].r, pairs[end].i, pairs[end].t) == (p.r, p.i, p.t):
                end += 1
            flips = [q.flip for q in pairs[at:end]]
            out.add(p.r, p.i, caption, calls.add_call(flips), flips, p.t)
            at = end
        return (out,)

    c = audit.config
    config = {
        "JSONL_PATH": audit.jsonl_path,
        "OUTPUT_DIR": c.get("OUTPUT_DIR"),
        "IMAGE_ROOT": None,
        "CACHE_DIR": c.get("CACHE_DIR"),
        "PROTOCOL": "corrected",
        "DEVICE": c["DEVICE"],
        "DTYPE": c["DTYPE"],
        "TEXT_BATCH_SIZE": c["TEXT_BATCH_SIZE"],
        "IMAGE_BATCH_SIZE": 1,
        "NUM_WORKERS": 0,
    }
    run = ModelRun(spec, audit.records, config)
    try:
        (scored,) = run.score(*run.pairs(build)).pairs
    finally:
        run.release()
    return [blind._gap(a, b) for a, b in zip(scored.base_sim.tolist(), scored.sim.tolist())]


def prior_paths(jsonl_path, tag, typed):
    """([where a `prior:<tag>` scorer looks for its score file: in OUTPUT_DIR when set, then beside the input],
    the script that writes it): run_lgip_by_fliptype.py's for a typed input, else run_lgip_multi.py's."""
    evaluation, script = ("fliptypes", "run_lgip_by_fliptype.py") if typed else ("multi", "run_lgip_multi.py")
    here = score_file(jsonl_path, evaluation, tag)
    beside = score_file(jsonl_path, evaluation, tag, beside_input=True)
    return list(dict.fromkeys([here, beside])), script


def prior_gaps(tag, audit):
    """`prior:<tag>`: each flip's prior_gap in a model's score file (section 9's b), matched on (line, caption
    index, type when typed, text, occurrence among equal texts); None for a pair the file has not (its image could
    not be read). The file is looked for in OUTPUT_DIR when set, then beside the input; an error names both and
    the command that writes it."""
    from .scorefile import iter_score_lines

    typed = audit.types != ["all"]
    paths, script = prior_paths(audit.jsonl_path, tag, typed)
    path = next((p for p in paths if os.path.isfile(p)), None)
    if path is None:
        where = " nor ".join(paths)
        raise InputError(
            f"SCORERS: prior:{tag}: no score file {where}; write it with\n  python {script} "
            f"--JSONL_PATH={audit.jsonl_path} --MODELS=<{tag}'s spec>"
            + (f" --OUTPUT_DIR={audit.config['OUTPUT_DIR']}" if audit.config.get("OUTPUT_DIR") else "")
        )
    found, with_prior = {}, 0
    for _, x in iter_score_lines(path, ("line", "caption_index")):
        seen = collections.Counter()
        for flip in x.get("flips") or []:
            key = (x["line"], x["caption_index"], flip.get("type", "all") if typed else "all", flip["text"])
            seen[key] += 1
            if flip.get("prior_gap") is not None:
                with_prior += 1
                found[key + (seen[key],)] = flip["prior_gap"]
    out, seen = [], collections.Counter()
    for p in audit.pairs:
        key = (audit.records[p.r][0], p.i, p.t, p.flip)
        seen[key] += 1
        g = found.get(key + (seen[key],))
        out.append(None if g is None else round(g, 9))
    if not with_prior:
        raise InputError(
            f"SCORERS: prior:{tag}: {path} has no prior_gap (an evaluation of fewer than 2 images has no prior)"
        )
    if not any(g is not None for g in out):
        raise InputError(f"SCORERS: prior:{tag}: {path} matches no pair of {audit.jsonl_path} (another input's?)")
    return out


def write_gaps(f, audit, gaps):
    """The gaps file's lines, one per pair in blind_pairs' order, to the open file `f`: its record, line,
    image_id, caption index, type, index, fold, the two texts and each scorer's gap ({name: g})."""
    for x, p in enumerate(audit.pairs):
        line, rec = audit.records[p.r]
        f.write(
            dump_jsonl_line(
                {
                    "record": p.r,
                    "line": line,
                    "image_id": rec.get("image_id"),
                    "caption_index": p.i,
                    "type": p.t,
                    "index": p.j,
                    "fold": audit.folds[p.r],
                    "caption": p.caption,
                    "flip": p.flip,
                    "gaps": {name: g[x] for name, g in gaps.items()},
                }
            )
        )


def read_gaps(path, pairs, names, rerun):
    """{name: [g or None per pair]} of the scorers `names` from a gaps file (write_gaps'), each line checked to be
    the pair it should (InputError naming path:line and the command `rerun` otherwise)."""
    from .records import iter_json_lines

    gaps, n = {s: [] for s in names}, 0
    for n, line in iter_json_lines(path):
        if n > len(pairs):
            raise InputError(f"{path}:{n}: more lines than the input's {len(pairs)} pairs: run\n  {rerun}")
        p = pairs[n - 1]
        if not isinstance(line, dict) or not isinstance(line.get("gaps"), dict):
            raise InputError(f"{path}:{n}: not a gaps line (an object with `gaps`): run\n  {rerun}")
        if (line.get("record"), line.get("caption_index"), line.get("type"), line.get("index")) != (p.r, p.i, p.t, p.j):
            raise InputError(f"{path}:{n}: not this input's pair {(p.r, p.i, p.t, p.j)}: run\n  {rerun}")
        for s in names:
            if s not in line["gaps"]:
                raise InputError(f"{path}:{n}: field 'gaps.{s}' missing: run\n  {rerun}")
            gaps[s].append(line["gaps"][s])
    if any(len(v) != len(pairs) for v in gaps.values()):
        raise InputError(f"{path}: {min(len(v) for v in gaps.values())} lines for {len(pairs)} pairs: run\n  {rerun}")
    return gaps
