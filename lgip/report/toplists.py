"""lgip.report.toplists: the paraphrases that move a model's score most and the flips it prefers
over their caption, streamed from the evaluations' `*.scores.jsonl` files keeping only the top K.

One pass over the score files keeps the top K of each model and the top K over all models
(`TopLists`); whichever the markdown lists, the page has both. A row is a dict: model, source
(evaluation), image (COCO id, else the file name), image_path (as in the record), caption,
caption_sim, text, sim, and delta (paraphrase: sim - caption_sim) or gap (flip: caption_sim - sim)
with the flip's type (and its prior gap, when the score file has it: the same flip scored against
the average other image, LGIP_SPEC.md 9) or the paraphrase's kind.

    >>> files, missing = score_files(metrics, found)
    >>> tops = scan_scores(files, k=10)
    >>> tops.flips[None][0]["gap"], tops.flips["tiny_siglip"][0]["text"]   # None: over all models
    (-0.247546, 'The dog is parked by a gray building.')
"""

import heapq
import math
import os

from ..errors import InputError
from ..scorefile import iter_score_lines


class TopK:
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


class TopLists:
    """paraphrases / flips: {model: its top rows, None: the top rows over all models}."""

    def __init__(self, paraphrases, flips, k):
        self.paraphrases, self.flips, self.k = paraphrases, flips, k

    def for_markdown(self, per_model):
        """(paraphrases, flips) as the markdown lists them: per model, or one list over all."""
        if per_model:
            return (
                {m: r for m, r in self.paraphrases.items() if m is not None},
                {m: r for m, r in self.flips.items() if m is not None},
            )
        return {None: self.paraphrases[None]}, {None: self.flips[None]}


def _offer(tops, score, key, make_row):
    """Offer to the model's list and to the list over all models: each sees what it would see
    alone; the row is made once, and only when one of them may keep it."""
    mine, every = tops
    if mine.full() and score <= mine.floor() and every.full() and score <= every.floor():
        return
    row = make_row()
    mine.offer(score, key, row)
    every.offer(score, key, row)


def _check_prior(v, where):
    """A flip's prior gap (optional in a score file: sim(average other image, caption) - sim(average
    other image, flip)): a finite number, else InputError naming `where`."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise InputError(f"{where} is {v!r}, not a finite number (the flip's prior gap) or null")


def image_label(line):
    """How a score line's image is named in the lists: its COCO id, else its file's name."""
    return line.get("image_id") if line.get("image_id") is not None else os.path.basename(line.get("image_path") or "")


def scan_scores(files, k):
    """Stream score files [(evaluation, model, path)] into the top-k paraphrase moves (|delta|) and
    flips preferred over their caption (gap < 0), per model and over all models; the same pair
    from two evaluations counts once. Models whose scores differ in kind (a cosine, a log-probability:
    LGIP_SPEC.md 13) are not ranked against each other: the list over all models takes each model's
    in turn."""
    para_all, flip_all = TopK(k), TopK(k)
    para_top, flip_top = {None: para_all}, {None: flip_all}
    kinds = {}  # model -> the score kind its lines say (LGIP_SPEC.md 13; a file from before: cosine)
    for source, model, path in files:
        para = (para_top.setdefault(model, TopK(k)), para_all)
        flip = (flip_top.setdefault(model, TopK(k)), flip_all)
        for lineno, r in iter_score_lines(path):  # (checked: a wrong file is named, path:line)
            base = r.get("sim")
            kinds.setdefault(model, r.get("score_kind") or "cosine")
            if base is None:
                continue
            where = (model, r.get("image_path"), r.get("caption_index"))
            for p in r.get("paraphrases") or ():
                delta = p["sim"] - base
                _offer(
                    para,
                    abs(delta),
                    where + (p["text"],),
                    lambda: {
                        "model": model,
                        "source": source,
                        "record": r,
                        "text": p["text"],
                        "kind": p.get("kind"),
                        "sim": p["sim"],
                        "delta": delta,
                    },
                )
            for j, fl in enumerate(r.get("flips") or ()):
                if fl.get("prior_gap") is not None:
                    _check_prior(fl["prior_gap"], f"{path}:{lineno}: field 'flips[{j}].prior_gap'")
                gap = base - fl["sim"]
                if gap >= 0:
                    continue
                _offer(
                    flip,
                    -gap,
                    where + (fl["text"],),
                    lambda: {
                        "model": model,
                        "source": source,
                        "record": r,
                        "text": fl["text"],
                        "type": fl.get("type"),
                        "sim": fl["sim"],
                        "gap": gap,
                        "prior_gap": fl.get("prior_gap"),
                    },
                )
    out = []
    for top in (para_top, flip_top):
        lists = {key: t.rows() for key, t in top.items()}
        if len(set(kinds.values())) > 1:  # scores of several kinds are in different units: the list over all
            lists[None] = in_turn([lists[m] for m in lists if m is not None], k)  # models takes each one's in turn
        for rows in lists.values():  # the records are only needed for a few fields
            for row in rows:
                r = row.pop("record", None)
                if r is not None:
                    row.update(
                        image=image_label(r),
                        image_path=r.get("image_path"),
                        caption=r.get("caption"),
                        caption_sim=r.get("sim"),
                    )
        out.append(lists)
    return TopLists(out[0], out[1], k)


def in_turn(lists, k):
    """The first k rows taken in turn from each list (its first, then each one's second, ...)."""
    out = []
    for rank in range(max((len(rows) for rows in lists), default=0)):
        out += [rows[rank] for rows in lists if rank < len(rows)]
    return out[:k]


def score_files(metrics, paths, sources=None, evaluations=None):
    """[(evaluation, model, score file)] that exist, and the missing (or empty) ones; `sources`: the
    evaluations to read (None: all), in the order of `evaluations` (keys)."""
    files, missing = [], []
    for key in evaluations or list(metrics):
        if key not in metrics or (sources is not None and key not in sources):
            continue
        folder = os.path.dirname(os.path.abspath(paths[key]))
        for m in metrics[key]:
            if not m.get("scores_file"):
                continue
            path = os.path.join(folder, m["scores_file"])
            # (an empty one is as good as missing: a run writes a line per record and caption)
            (files if os.path.isfile(path) and os.path.getsize(path) else missing).append((key, m["model_tag"], path))
    return files, missing
