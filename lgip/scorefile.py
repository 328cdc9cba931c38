"""lgip.scorefile: the per-pair score files (`*.scores.jsonl`): one line per record and
caption with the caption's similarity and each paraphrase's, flip's and combined text's, made a
column at a time; its text less the numbers is made once per run (accelerations.SHARED_SCORE_LAYOUT).
Read back checked (`iter_score_lines`), and as flat rows, a row per scored text (`iter_pairs`: lgip.export's
tables, lgip.compare's figures, lgip.trackers' samples).

    >>> sidecar = ScoreSidecar(records); sidecar.add("flips", pairs, type=types); sidecar.save(path)
    >>> read_flip_gaps(path)[0]   # (line, caption index, flip, caption sim - flip sim)
    (1, 0, 'A blue bus parked on the side of the street.', 0.012345)
"""

import itertools
import json
import operator
import os
import sys

from . import accelerations
from .memory import KEPT
from .errors import InputError, OutputError
from .util import finite_number
from .outputs import atomic_open


def _json_values(values):
    """[json.dumps(v, ensure_ascii=False) for v in values], at C speed for the str, int, None
    and float values of a score file (texts, similarities, labels)."""
    import math

    values = values.tolist() if hasattr(values, "tolist") else list(values)
    kinds = set(map(type, values))
    if kinds <= {str}:
        return list(map(json.encoder.encode_basestring, values))
    if kinds <= {float} and all(map(math.isfinite, values)):
        return list(map(float.__repr__, values))
    if kinds <= {int}:
        return list(map(int.__repr__, values))
    fast = {
        str: json.encoder.encode_basestring,
        int: int.__repr__,
        type(None): lambda v: "null",
        float: lambda v: float.__repr__(v) if math.isfinite(v) else json.dumps(v),
    }  # NaN, Infinity as json writes them
    if kinds <= set(fast):
        return [fast[type(v)](v) for v in values]
    return [json.dumps(v, ensure_ascii=False) for v in values]


def _rounded(values, digits=6):
    """round(float(v), digits) of each value (Python's correctly rounded round, not numpy's)."""
    return [round(v, digits) for v in map(float, values.tolist() if hasattr(values, "tolist") else values)]


def _rounded_json(values):
    """_json_values(_rounded(values)) at twice its speed: "%.6f" gives round(v, 6)'s correctly
    rounded digits, and for 2e-4 <= |v| < 0.99 the shortest repr of that rounded double is those
    digits without trailing zeros (any shorter decimal is another multiple of 1e-6, ~1e10 ulps
    away); other values (near 0 or 1, NaN) go through round and repr.
    >>> _rounded_json([0.12345650000000001, 0.5, 3e-05])
    ['0.123457', '0.5', '3e-05']
    """
    import numpy as np

    x = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        other = np.flatnonzero(~((np.abs(x) >= 2e-4) & (np.abs(x) < 0.99)))
    if 4 * len(other) > len(x):  # (mostly zeros: a stand-in model's)
        return _json_values(_rounded(x))
    out = [s.rstrip("0") for s in map("%.6f".__mod__, x.tolist())]
    for j, text in zip(other.tolist(), _json_values(_rounded(x[other]))):
        out[j] = text
    return out


class PerModel:
    """A score-file label whose values differ between the models of a run (floats, written as
    json writes them: round them first), so that the file's layout can still be shared.
    >>> sidecar.add("flips", pairs, type=types, strength=PerModel(np.round(s, 6)))
    """

    def __init__(self, values):
        import numpy as np

        self.values = np.asarray(values, dtype=np.float64)

    def __len__(self):
        return len(self.values)


class _ScoreLayout:
    """A score file's text with its numbers left out: `pieces`, [text before, number, text
    after] per number, whose numbers come from `src` in the groups' [base_sim, sim, *PerModel
    labels] values (similarities rounded to 6 decimals; PerModel labels written as they are,
    `raw`). It depends on the records, pairs and other labels alone, which every model of a run
    shares, so the run's later models only format and place their numbers (40,000 images:
    200,000 lines of record fields, 1.46M texts with their labels, made once; 1.66M similarities
    per model: 2.7 -> 0.9 s per later model, benchmarks/BENCHMARKS.md).
    >>> layout = _ScoreLayout(records, groups); text = layout.text(groups)
    """

    def __init__(self, records, groups):
        import numpy as np

        width = 1 + max(int(np.max(p.cap)) for _, p, _ in groups)
        keys, grps, positions, srcs, raws, befores, afters = [], [], [], [], [], [], []
        line_keys, line_src, offset = (
            [],
            [],
            0,
        )  # per group: its lines, and the value each would give its caption's "sim"
        for g, (name, pairs, labels) in enumerate(groups):
            n = len(pairs)
            key = np.asarray(pairs.rec, dtype=np.int64) * width + np.asarray(pairs.cap, dtype=np.int64)
            order = np.argsort(key, kind="stable")  # (evaluations add pairs in record order: already sorted)
            key = key[order]
            first = np.diff(key, prepend=-1) != 0
            last = np.append(key[1:] != key[:-1], True)
            line_keys.append(key[first])
            line_src.append(offset + order[last])  # a caption's "sim": the base_sim of its last pair added
            order_list, last_list = order.tolist(), last.tolist()
            head = ", " + _json_values([name])[0] + ": ["
            texts = _json_values(pairs.text)
            slot_befores = [
                [
                    (head if f else ", ") + '{"text": ' + texts[j] + ', "sim": '
                    for j, f in zip(order_list, first.tolist())
                ]
            ]
            slot_afters, form, columns = (
                [],
                "",
                [],
            )  # the text after each number of an item: its labels up to the next number
            for label, values in [*labels.items(), (None, None)]:
                if label is not None and not isinstance(values, PerModel):
                    form += ", " + _json_values([label])[0].replace("%", "%%") + ": %s"
                    columns.append(_json_values(values))
                    continue
                form += "}" if label is None else ", " + _json_values([label])[0].replace("%", "%%") + ": "
                tails = [form % item for item in zip(*columns)] if columns else [form % ()] * n
                slot_afters.append([tails[j] for j in order_list])
                form, columns = "", []
                if label is not None:
                    slot_befores.append([""] * n)
            slot_afters[-1] = [a + "]" if e else a for a, e in zip(slot_afters[-1], last_list)]
            per_item = len(slot_afters)  # the similarity, then each PerModel label
            for t in range(per_item):
                keys.append(key), grps.append(np.full(n, g)), positions.append(np.arange(n) * per_item + t)
                srcs.append(offset + (1 + t) * n + order), raws.append(np.full(n, t > 0))
                befores.append(slot_befores[t]), afters.append(slot_afters[t])
            offset += (1 + per_item) * n
        lines = np.unique(np.concatenate(line_keys))
        sim_src = np.zeros(len(lines), dtype=np.int64)
        for k, src in zip(line_keys, line_src):
            sim_src[np.searchsorted(lines, k)] = src  # (a later group's caption sim wins, as the groups were added)
        recs = [records[k] for k in (lines // width).tolist()]
        caps = (lines % width).tolist()
        heads = zip(
            _json_values([line for line, _ in recs]),
            _json_values([r.get("image_id") for _, r in recs]),
            _json_values([r["image_path"] for _, r in recs]),
            caps,
            _json_values([r["orig_captions"][i] for (_, r), i in zip(recs, caps)]),
        )
        (
            keys.insert(0, lines),
            grps.insert(0, np.full(len(lines), -1)),
            positions.insert(0, np.zeros(len(lines), dtype=np.int64)),
        )
        srcs.insert(0, sim_src), raws.insert(0, np.zeros(len(lines), dtype=bool)), afters.insert(0, [""] * len(lines))
        befores.insert(
            0,
            [
                f'{{"line": {line}, "image_id": {image_id}, "image_path": {path}, "caption_index": {i}, '
                f'"caption": {caption}, "sim": '
                for line, image_id, path, i, caption in heads
            ],
        )
        key = np.concatenate(keys)
        slot = np.lexsort(
            (np.concatenate(positions), np.concatenate(grps), key)
        )  # per line: its sim, then each group's items
        self.src = np.concatenate(srcs)[slot]
        self.raw = np.flatnonzero(np.concatenate(raws)[slot])
        before, after = list(itertools.chain.from_iterable(befores)), list(itertools.chain.from_iterable(afters))
        for j in slot[np.append(key[slot][1:] != key[slot][:-1], True)].tolist():
            after[j] += "}\n"  # (the line's last item)
        take = operator.itemgetter(*slot.tolist()) if len(slot) > 1 else lambda seq: (seq[int(slot[0])],)
        self.pieces = [None] * (3 * len(slot))  # [before, number, after] per place
        self.pieces[0::3], self.pieces[2::3] = take(before), take(after)

    def text(self, groups):
        """The file's text, with these groups' similarities and PerModel labels."""
        import numpy as np

        values = np.concatenate(
            [
                np.asarray(x, dtype=np.float64)
                for _, p, labels in groups
                for x in (p.base_sim, p.sim, *(v.values for v in labels.values() if isinstance(v, PerModel)))
            ]
        )
        values = values[self.src]
        numbers = _rounded_json(values)
        for j, number in zip(self.raw.tolist(), _json_values(values[self.raw])):
            numbers[j] = number
        self.pieces[1::3] = numbers
        return "".join(self.pieces)


class ScoreSidecar:
    """Per record and caption: the caption's similarity and each paraphrase's, flip's (and
    combined text's) similarity, written as one JSON line per caption next to the metrics.

    Line format: {"line", "image_id", "image_path", "caption_index", "caption", "sim",
                  "paraphrases": [{"text", "sim", ...}], "flips": [{"text", "sim", "type"}], ..., "score_kind"}
    ("sim" holds the model's score s: a cosine, or a joint scorer's, LGIP_SPEC.md 13, as score_kind says)
    Similarities are rounded to 6 decimals; lines are in (record, caption) order, a line's
    groups in the order they were added, each group's items in pair order. The text is made a
    column at a time (~1.4M pairs at 40,000 images: a dict per pair, dumped line by line, took
    ~6 s per model while the GPU waited), and all but the similarities once per run
    (_ScoreLayout: the run's models score the same pairs, and label them alike).
    >>> sidecar = ScoreSidecar(records); sidecar.add("flips", pairs, type=types); sidecar.save(path)
    """

    def __init__(self, records, score_kind=None):
        self.records, self.score_kind = (
            records,
            score_kind,
        )  # score_kind: what "sim" holds (LGIP_SPEC.md 13), each line's
        self.groups = []  # (group name, Pairs, labels), in the order added

    def add(self, group, pairs, **labels):
        """Append scored `pairs` to `group` ("paraphrases", "flips", "combined") of their captions;
        `labels` maps a field name to one value per pair (a PerModel for values that differ
        between the run's models)."""
        if any(group == g for g, _, _ in self.groups):
            raise ValueError(f"score group {group!r} added twice: add all its pairs in one call")
        for name, values in labels.items():
            if len(values) != len(pairs):
                raise ValueError(
                    f"score label {name!r} of group {group!r} has {len(values)} values for {len(pairs)} pairs"
                )
        self.groups.append((group, pairs, labels))

    def _layout(self, groups):
        """The layout of these groups: the last one made, when made from the same records, pair
        lists (the run's models share them: ModelRun.pairs) and labels."""
        objects = [self.records, *(seq for _, p, _ in groups for seq in (p.rec, p.cap, p.text))]  # the same ones
        values = [
            (
                name,
                len(p),
                list(labels),
                [
                    None if isinstance(v, PerModel) else v.tolist() if hasattr(v, "tolist") else list(v)
                    for v in labels.values()
                ],
            )
            for name, p, labels in groups
        ]
        if not accelerations.SHARED_SCORE_LAYOUT:
            return _ScoreLayout(self.records, groups)
        if KEPT.score_layout is not None:
            (last_objects, last_values), layout = KEPT.score_layout
            if (
                len(last_objects) == len(objects)
                and all(map(operator.is_, last_objects, objects))
                and last_values == values
            ):
                return layout
        KEPT.score_layout = ((objects, values), _ScoreLayout(self.records, groups))
        return KEPT.score_layout[1]

    def text(self):
        """The file's text."""
        groups = [(g, p, labels) for g, p, labels in self.groups if len(p)]
        text = self._layout(groups).text(groups) if groups else ""
        if self.score_kind is not None:  # (the layout is the run's models' own: the model's kind ends each line;
            # a line's last "}" is followed by its newline, which JSON escapes inside a string)
            text = text.replace("}\n", ', "score_kind": ' + json.dumps(self.score_kind) + "}\n")
        return text

    def lines(self):
        """The file's lines, in order (JSON escapes a newline inside a string: each ends one)."""
        return [line + "\n" for line in self.text().split("\n")[:-1]]

    def write(self, path):
        """Write the file (OutputError, saying why and what to do, when it cannot be)."""
        with atomic_open(path) as f:
            f.write(self.text())
        return path

    def save(self, path):
        """The file written, as its name for the metrics; None when it cannot be written (no
        space, no permission): said at once, and the run goes on, so that its metrics, a small
        fraction of its size, are still written; the script then ends with exit status 4 naming
        it (lgip.cli.run_main)."""
        try:
            return os.path.basename(self.write(path))
        except OutputError as e:
            print(
                f"warning: {e} The run goes on without this score file (--WRITE_SCORES=False writes none): "
                f"its metrics are still written (on the command line it then ends with exit status 4; from "
                f"Python its metrics say scores_file null).",
                file=sys.stderr,
                flush=True,
            )
            return None


def iter_score_lines(path, numbers=("caption_index",)):
    """(line number, line) of a score file, each checked: an object whose fields `numbers` are
    numbers, whose `sim` is a number or null (a caption without a score) and whose `paraphrases` /
    `flips` (when there) are objects with a `text` and a `sim`; an InputError names path:line and
    the field of any other (a wrong file, not a traceback). A byte-order mark at its start is fine."""
    from .records import iter_json_lines

    for lineno, row in iter_json_lines(path):
        where = f"{path}:{lineno}"
        if not isinstance(row, dict):
            raise InputError(f"{where}: not a *.scores.jsonl line (a JSON object)")
        for field in numbers:
            if not finite_number(row.get(field)):
                raise InputError(f"{where}: field {field!r} missing or not a number (not a *.scores.jsonl line)")
        if "sim" not in row:
            raise InputError(
                f"{where}: field 'sim' missing (the caption's similarity, or null: not a *.scores.jsonl line)"
            )
        if row["sim"] is not None and not finite_number(row["sim"]):
            raise InputError(f"{where}: field 'sim' is {row['sim']!r}, not a finite number or null")
        for field in ("caption", "image_path"):
            if field in row and not isinstance(row[field], str):
                raise InputError(f"{where}: field {field!r} is {type(row[field]).__name__}, not a string")
        for field in ("paraphrases", "flips"):
            if row.get(field) is not None and not isinstance(row[field], list):
                raise InputError(f"{where}: field {field!r} is {type(row[field]).__name__}, not a list of objects")
            for j, item in enumerate(row.get(field) or []):
                if (
                    not isinstance(item, dict)
                    or not isinstance(item.get("text"), str)
                    or not finite_number(item.get("sim"))
                ):
                    raise InputError(f"{where}: field '{field}[{j}]' is not an object with 'text' and a finite 'sim'")
        yield lineno, row


def read_flip_gaps(path):
    """[(record line, caption index, flip text, gap)] of every flip of a score file, gap = the
    caption's similarity less the flip's (in file order)."""
    return [
        (row["line"], row["caption_index"], item["text"], row["sim"] - item["sim"])
        for _, row in iter_score_lines(path, ("line", "caption_index", "sim"))
        for item in row.get("flips") or []
    ]


# --- a score file as flat rows (lgip.export's tables, lgip.compare, lgip.trackers' samples) ---

COLUMNS = ("model", "record", "line", "caption_index", "kind", "type", "text", "score", "image_path")
# (gap: the caption's score less this text's; prior_gap: LGIP_SPEC.md 9's b, a flip's with the average other image;
# strength: the enhanced analysis's; other_image_path: the image an image flip mixed in; score_kind: what a score is)
EXTRA_COLUMNS = ("gap", "prior_gap", "strength", "other_image_path", "score_kind")
# the evaluations that write score files, by the name their tables take (a new one: its script's name less run_lgip_)
SCRIPT_KEYS = {
    "run_lgip_multi.py": "multi",
    "run_lgip_by_fliptype.py": "fliptypes",
    "rebuttal_enhanced_lgip_by_transformation.py": "enhanced",
    "run_lgip_images.py": "images",
}
GROUP_KINDS = {"paraphrases": "paraphrase", "flips": "flip", "combined": "combined"}


def script_key(script):
    """'multi' for run_lgip_multi.py: the name of an evaluation's table."""
    name = os.path.basename(script or "")
    return SCRIPT_KEYS.get(name) or os.path.splitext(name)[0].replace("run_lgip_", "") or "scores"


def stem_of(metrics_file):
    """The input stem a metrics file is named after: what comes before its last `__LGIP_` or `__ENHANCED_LGIP_`."""
    name = os.path.basename(metrics_file)
    for mark in ("__ENHANCED_LGIP_", "__LGIP_"):
        if mark in name:
            return name[: name.rindex(mark)]
    return name.split("__")[0]


def iter_pairs(path, model):
    """A row per scored text of a score file (COLUMNS then EXTRA_COLUMNS, as a tuple), in file order."""
    for _, line in iter_score_lines(path, ("line", "caption_index")):
        head = (model, line.get("image_id"), line["line"], line["caption_index"])
        caption, base, path_of, kind_of = (
            line.get("caption"),
            line["sim"],
            line.get("image_path"),
            line.get("score_kind"),
        )
        yield head + ("caption", None, caption, base, path_of, None, None, None, None, kind_of)
        for group, items in line.items():
            if not isinstance(items, list):
                continue
            image = group.startswith("image_")
            kind = GROUP_KINDS.get(group, group[:-1] if group.endswith("s") else group)
            for item in items:
                if not isinstance(item, dict) or "sim" not in item:
                    continue
                score = item["sim"]
                yield head + (
                    kind,
                    item["text"] if image else item.get("type", item.get("kind")),
                    caption if image else item.get("text"),
                    score,
                    path_of,
                    None if base is None or score is None else round(base - score, 6),
                    item.get("prior_gap"),
                    item.get("strength"),
                    item.get("other_image_path"),
                    kind_of,
                )
