"""lgip.image_side: the image side of LGIP (LGIP_SPEC.md section 11) over a ModelRun: the altered images
of its records made and scored by the model's scorer (lgip.alterations' pixels, made in the image loader's
workers, cached; lgip.scorers' score_images), the image pairs scored, RoCOCO's text-to-image search with the altered
images in the gallery, and the figures with their intervals.

`ImageSide(run, scored, captions, kinds, seed)`, with `scored = run.score(keep_embeddings=True)`: the records whose
image reads, every process's, in file order (so pi(r) is the same on every torchrun process), this
process's altered images (one per kind and record: paraphrase kinds for records with a caption
they can pair with, flip kinds for every readable record, so the galleries hold them all)
encoded or read from the cache, the weights loaded only when one is missing. `part()` is what
this process contributes (its pairs, its part of the galleries); on rank 0 `figures(parts, ...)`
merges them in record order, as one process would have them.

Pairs: (record r, caption i, kind): base = cos(v, t_i), sim = cos(v', t_i) (v' the altered image);
invariance error |sim - base| (paraphrase kinds; hflip leaves out captions naming left or right);
image gap base - sim (flip kinds), positive when > 0. Search, per flip kind: each caption queries
its block's originals and their altered images of that kind; rank of its own original = 1 + the
gallery images strictly more similar (an embedding present several times, byte for byte, is one
column counted as often: copies tie exactly); the top-1 image is an altered one when the best
altered image is strictly more similar than the best original (ties go to the originals).

Worked example: one gallery of two images v0 = (1, 0), v1 = (0, 1), their altered images
a0 = (.6, .8), a1 = (.8, -.6); captions t0 = (1, 0) of record 0 and t1 = (.6, .8) of record 1.
t0 finds its own image first (1.0; then a1 .8, a0 .6): rank 1, top-1 an original. For t1, a0 (1.0)
is more similar than its own image v1 (.8): rank 2, and the top-1 image is an altered one.
    >>> import numpy as np, torch
    >>> rank, top1 = flip_search(torch.tensor([[1., 0.], [0., 1.]]), torch.tensor([[.6, .8], [.8, -.6]]),
    ...                          np.array([0, 1]), torch.tensor([[1., 0.], [.6, .8]]), size=None)
    >>> rank.tolist(), top1.tolist()
    ([1, 2], [False, True])
"""

import os
import sys

from .alterations import (
    FLIP_KINDS,
    KINDS,
    PARAPHRASE_KINDS,
    AlteredImage,
    alter,
    flip_offset,
    mentions_left_or_right,
    partner,
)
from .errors import ConfigError
from .images import open_rgb
from .retrieval import CHUNK_ELEMENTS, KS, _chunks, _distinct_rows, check_gallery_size
from .scoring import Pairs, add_ci, mean_or_none

MAX_LISTED = 20  # failed altered images listed in the metrics (all are counted)


def check_kinds(kinds):
    """KINDS: a non-empty list of alteration names (or one string "a,b"), each once; returned in
    section 11's order (jpeg, downscale, crop, hflip, mix, patch), else a ConfigError."""
    if isinstance(kinds, str):
        kinds = [k.strip() for k in kinds.split(",") if k.strip()]
    if not isinstance(kinds, (list, tuple)) or not kinds or not all(isinstance(k, str) for k in kinds):
        raise ConfigError(f"KINDS must be a non-empty list of image alterations from {', '.join(KINDS)}, got {kinds!r}")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ConfigError(
            f"KINDS: unknown image alteration{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"valid: {', '.join(KINDS)}"
        )
    if len(set(kinds)) != len(kinds):
        raise ConfigError(f"KINDS names a kind twice: {list(kinds)!r}")
    return [k for k in KINDS if k in kinds]


def check_seed(seed):
    """SEED: an int >= 0 (numpy's default_rng([SEED, r]) takes no negative seed)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"SEED must be an int >= 0 (the image flips' seed), got {seed!r}")
    return seed


class ImageSide:
    """One model's image side over a ModelRun (see the module docstring)."""

    def __init__(self, run, scored, captions, kinds, seed):
        import numpy as np

        self.run, self.scored, self.kinds, self.seed = run, scored, list(kinds), seed
        # every process's readable records: N and each record's r agree everywhere
        self.readable = sorted(k for part in run.all_gathered(sorted(scored.ok)) for k in part)
        self.n = len(self.readable)
        self.offset = flip_offset(self.n, seed) if any(k in FLIP_KINDS for k in self.kinds) else None
        self.position = {k: r for r, k in enumerate(self.readable)}
        self.mine = sorted(scored.ok)
        keep = np.isin(np.asarray(captions.rec, dtype=np.int64), np.asarray(self.mine, dtype=np.int64))
        take = np.flatnonzero(keep)
        self.cap_rec = np.asarray(captions.rec, dtype=np.int64)[take]
        self.cap_i = np.asarray(captions.cap, dtype=np.int64)[take]
        self.cap_slot = np.asarray(captions.slot, dtype=np.int64)[take]
        self.cap_lr = np.array([mentions_left_or_right(captions.text[j]) for j in take.tolist()], dtype=bool)
        self.items, self.row = self._items()
        self.scores = self.failed = None  # (encode: the model's lgip.scorers.ImageScores)

    def path(self, k):
        return os.path.join(self.run.image_root, self.run.records[k][1]["image_path"])

    def partner_of(self, k):
        """The record whose image record k's flips take."""
        return self.readable[partner(self.position[k], self.n, self.offset)]

    def _items(self):
        """This process's altered images, each once (a repeated image_path: one paraphrase item),
        record by record and kinds in order (a worker then decodes a record's files once), and
        (record, kind) -> its item."""
        unique, row = {}, {}
        for k in self.mine:
            caps = self.run.records[k][1]["orig_captions"]
            for kind in self.kinds:
                if kind in FLIP_KINDS:
                    if self.offset is None:
                        continue  # (N < 2: no other image)
                    item = AlteredImage(self.path(k), kind, self.path(self.partner_of(k)), self.seed, self.position[k])
                elif not caps or (kind == "hflip" and all(map(mentions_left_or_right, caps))):
                    continue  # it would make no pair
                else:
                    item = AlteredImage(self.path(k), kind, None, self.seed, 0)
                row[k, kind] = unique.setdefault(item, len(unique))
        return list(unique), row

    def encode(self):
        """Score this process's altered images with the captions of the records each was made for, through
        the model's scorer (lgip.scorers: a dual encoder embeds them, decoded and altered in the loader's
        workers and read from the cache where there; a joint scorer scores each pair). The weights are
        loaded only when something is not cached (a file that is not there needs no model: it is reported)."""
        texts = {}
        for (k, kind), j in self.row.items():
            texts.setdefault(j, []).extend(self.run.records[k][1]["orig_captions"])
        captions = [list(dict.fromkeys(texts.get(j, []))) for j in range(len(self.items))]
        self.scores = self.run.score_images(self.items, captions)
        self.failed, self.sources = self.scores.failed, self.scores.sources
        for j, err in list(self.failed.items())[:MAX_LISTED]:
            item = self.items[j]
            print(
                f"warning: {self.run.enc.name}: altered image {item.kind} of {item.source} could not be made ({err})",
                file=sys.stderr,
            )
        return self

    def part(self):
        """What this process contributes: its pairs' state, its part of the galleries (host tensors
        under torchrun), the altered images' counts and failures."""
        import numpy as np
        import torch

        run = self.run
        failed = np.zeros(len(self.items), dtype=bool)
        failed[list(self.failed)] = True
        scores = self.scores
        base = scores.original(self.cap_rec, self.cap_i, self.cap_slot)
        where, kind_no, sims = [], [], []
        for n, kind in enumerate(self.kinds):
            alt = np.array([self.row.get((k, kind), -1) for k in self.cap_rec.tolist()], dtype=np.int64)
            use = alt >= 0
            use[use] = ~failed[alt[use]]
            if kind == "hflip":
                use &= ~self.cap_lr
            j = np.flatnonzero(use)
            (
                where.append(j),
                kind_no.append(np.full(len(j), n)),
                sims.append(
                    np.zeros(0)
                    if not len(j)
                    else scores.altered(alt[j], self.cap_rec[j], self.cap_i[j], self.cap_slot[j])
                ),
            )
        where, kind_no, sims = np.concatenate(where), np.concatenate(kind_no), np.concatenate(sims)
        order = np.lexsort((kind_no, where))  # (record, caption, kind): the score file's order
        where, kind_no = where[order], kind_no[order]
        pairs = Pairs()
        labels = [self.kinds[n] for n in kind_no.tolist()]
        pairs.rec, pairs.cap = self.cap_rec[where].tolist(), self.cap_i[where].tolist()
        pairs.base_slot = pairs.slot = self.cap_slot[where].tolist()
        pairs.text, pairs.label = labels, labels
        pairs.base_sim, pairs.sim, pairs.labels = base[where], sims[order], np.array(labels, dtype=object)
        flip_kinds = [k for k in self.kinds if k in FLIP_KINDS] if self.offset is not None else []
        host = (lambda x: x.cpu()) if run.world > 1 else (lambda x: x)
        gallery = None
        if flip_kinds and scores.embeddings is not None:  # (scores alone: a gallery needs every caption's with
            # every image)
            emb, img_emb = scores.embeddings, self.scored.image_embeddings
            txt_emb, rows = self.scored.text_embeddings
            rows = np.asarray(rows)
            mine = torch.as_tensor(self.mine, dtype=torch.long, device=img_emb.device)
            altered = {}
            for kind in flip_kinds:
                at = torch.as_tensor([self.row[k, kind] for k in self.mine], dtype=torch.long, device=emb.device)
                altered[kind] = host(emb[at])  # (NaN rows: not made)
            caps = torch.as_tensor(rows[self.cap_slot], dtype=torch.long, device=txt_emb.device)
            gallery = {
                "records": np.asarray(self.mine, dtype=np.int64),
                "images": host(img_emb[mine]),
                "altered": altered,
                "cap_rec": self.cap_rec,
                "captions": host(txt_emb[caps]),
            }
        failures = [
            {"image": self.items[j].source, "kind": self.items[j].kind, "error": e}
            for j, e in list(self.failed.items())[:MAX_LISTED]
        ]
        return {
            "pairs": pairs.state(),
            "gallery": gallery,
            "sources": self.sources,
            "num_failed": len(self.failed),
            "failed": failures,
        }

    def figures(self, parts, gallery_size, resamples, seed):
        """Section 11's figures from every process's part (rank 0): the metrics after model_tag,
        and the merged pairs (for the score file)."""
        import numpy as np

        pairs = Pairs.merged([p["pairs"] for p in parts])
        rec, labels = np.asarray(pairs.rec, dtype=np.int64), np.asarray(pairs.label, dtype=object)
        base, sim = np.asarray(pairs.base_sim), np.asarray(pairs.sim)
        m = {"num_samples": self.scored.n_samples}
        side = {"para": np.isin(labels, PARAPHRASE_KINDS), "flip": np.isin(labels, FLIP_KINDS)}
        err, gap = np.abs(sim - base), base - sim
        headline = (
            ("image_invariance_error_mean", "para", err),
            ("image_sensitivity_gap_mean", "flip", gap),
            ("image_sensitivity_pos_rate", "flip", gap > 0),
        )
        for key, which, values in headline:
            _figure(m, key, rec[side[which]], values[side[which]], resamples, seed)
        found = self._search([p["gallery"] for p in parts], gallery_size)
        m["by_kind"] = {}
        for kind in self.kinds:
            mask = labels == kind
            block = m["by_kind"][kind] = {"count": int(mask.sum())}
            if kind in PARAPHRASE_KINDS:
                _figure(block, "image_invariance_error_mean", rec[mask], err[mask], resamples, seed)
                continue
            _figure(block, "image_sensitivity_gap_mean", rec[mask], gap[mask], resamples, seed)
            _figure(block, "image_sensitivity_pos_rate", rec[mask], gap[mask] > 0, resamples, seed)
            if self.scores.no_gallery is not None:
                block["note"] = self.scores.no_gallery
                continue
            q_rec, rank, top1 = found.get(kind, (np.zeros(0, dtype=np.int64),) * 3)
            for k in KS:
                _figure(block, f"t2i_flip_recall@{k}", q_rec, rank <= k, resamples, seed)
            _figure(block, "t2i_flip_top1_rate", q_rec, top1, resamples, seed)
            if self.offset is None:
                block["note"] = (
                    f"no image flips: {self.n} readable image{'s' if self.n != 1 else ''}, and a flip needs "
                    f"another record's image (N >= 2)"
                )
        size = check_gallery_size(gallery_size) or max(self.n, 1)
        m.update(
            num_images=self.n, flip_offset=self.offset, gallery_size=min(size, self.n), num_blocks=-(-self.n // size)
        )
        sources = {key: sum(p["sources"][key] for p in parts) for key in parts[0]["sources"]}
        failed = [f for p in parts for f in p["failed"]]
        m["altered_images"] = dict(sources, num_failed=sum(p["num_failed"] for p in parts), failed=failed[:MAX_LISTED])
        return m, pairs

    def _search(self, galleries, gallery_size):
        """{flip kind: (each caption query's record, its own image's rank, top-1 altered)}, the
        galleries of every process merged in record order (rank 0)."""
        import numpy as np
        import torch

        galleries = [g for g in galleries if g is not None]
        if not galleries:
            return {}
        device = self.scored.image_embeddings.device  # (galleries come with embeddings)
        records = np.concatenate([g["records"] for g in galleries])
        order = np.argsort(records, kind="stable")
        cap_rec = np.concatenate([g["cap_rec"] for g in galleries])
        cap_order = np.argsort(cap_rec, kind="stable")  # (a record's captions all come from one process, in order)
        joined = lambda get, o: torch.cat([get(g).to(device) for g in galleries])[torch.as_tensor(o, device=device)]
        images, captions = joined(lambda g: g["images"], order), joined(lambda g: g["captions"], cap_order)
        cap_pos = np.searchsorted(records[order], cap_rec[cap_order])
        out = {}
        for kind in galleries[0]["altered"]:
            rank, top1 = flip_search(
                images, joined(lambda g: g["altered"][kind], order), cap_pos, captions, gallery_size
            )
            out[kind] = (cap_rec[cap_order], rank, top1)
        return out

    def score_groups(self, pairs):
        """The score file's groups of the merged pairs: ("image_paraphrases", pairs, {}) and
        ("image_flips", pairs, {"other_image_path": the image each flip mixed in, "r": the record's
        index among the readable ones, which with SEED fixes patch's box: the report remakes the
        altered image from these})."""
        import numpy as np

        labels = np.asarray(pairs.label, dtype=object)
        para = pairs.subset(np.flatnonzero(np.isin(labels, PARAPHRASE_KINDS)))
        flips = pairs.subset(np.flatnonzero(np.isin(labels, FLIP_KINDS)))
        other = [self.run.records[self.partner_of(k)][1]["image_path"] for k in flips.rec]
        r = [self.position[k] for k in flips.rec]
        return [("image_paraphrases", para, {}), ("image_flips", flips, {"other_image_path": other, "r": r})]


def image_flip_positives(pairs):
    """(each image-flip pair's record, whether its caption scores the original above the altered
    image): the per-pair values of image_sensitivity_pos_rate, which models are compared on
    (LGIP_SPEC.md sections 9 and 12)."""
    import numpy as np

    flip = np.isin(np.asarray(pairs.label, dtype=object), FLIP_KINDS)
    gap = np.asarray(pairs.base_sim) - np.asarray(pairs.sim)
    return np.asarray(pairs.rec, dtype=np.int64)[flip], gap[flip] > 0


def _figure(block, key, records, values, resamples, seed):
    import numpy as np

    values = np.asarray(values, dtype=np.float64)
    block[key] = mean_or_none(values)
    add_ci(block, key, records, values, resamples, seed)


def flip_search(images, altered, cap_pos, cap_emb, size=5000, chunk_elements=None):
    """RoCOCO's text-to-image search with altered images in the gallery (LGIP_SPEC.md section 11):
    `images` [n, D] the readable records' originals in file order, `altered` [n, D] their altered
    images of one kind (NaN rows: not made), `cap_pos` each caption's record position (ascending),
    `cap_emb` [m, D]. Blocks of `size` records (None: one); similarities in float32. Returns
    (rank of each caption's own original, whether its top-1 image is an altered one), numpy."""
    import numpy as np
    import torch

    n = len(images)
    size = check_gallery_size(size) or max(n, 1)
    device = images.device
    budget = chunk_elements or CHUNK_ELEMENTS.get(device.type, CHUNK_ELEMENTS["cuda"])
    cap_pos = np.asarray(cap_pos, dtype=np.int64)
    rank, top1 = np.zeros(len(cap_pos), dtype=np.int64), np.zeros(len(cap_pos), dtype=bool)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 similarities, as section 7
    try:
        with torch.no_grad():
            for lo in range(0, n, size):
                hi = min(lo + size, n)
                a, b = np.searchsorted(cap_pos, [lo, hi])
                if a == b:
                    continue
                alt = altered[lo:hi].to(device)
                made_rows = alt[~torch.isnan(alt[:, 0])]
                gallery = torch.cat([images[lo:hi], made_rows.to(images.dtype)]) if len(made_rows) else images[lo:hi]
                first, col = _distinct_rows(gallery)  # copies of an embedding: one column, counted as often
                emb = gallery[torch.as_tensor(first, device=device)].float()
                weight = torch.as_tensor(np.bincount(col, minlength=len(first)).astype(np.float32), device=device)
                originals = torch.as_tensor(np.unique(col[: hi - lo]), device=device)
                made = torch.as_tensor(np.unique(col[hi - lo :]), dtype=torch.long, device=device)
                own = torch.as_tensor(col[cap_pos[a:b] - lo], device=device)
                for c0, c1 in _chunks(b - a, len(first), budget):
                    sims = cap_emb[a + c0 : a + c1].to(device).float() @ emb.T
                    target = sims.gather(1, own[c0:c1, None])
                    rank[a + c0 : a + c1] = (1 + (sims > target).float() @ weight).round().long().cpu().numpy()
                    best = sims.index_select(1, originals).amax(dim=1)
                    if len(made):
                        top1[a + c0 : a + c1] = (sims.index_select(1, made).amax(dim=1) > best).cpu().numpy()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return rank, top1


def save_examples(folder, records, readable, image_root, kinds, seed, count):
    """The first `count` readable records' altered images (and each original), as PNG files in
    `folder` for looking at: `<line>_<kind>.png`, `<line>_original.png`. Returns the folder."""
    from .outputs import atomic_open

    os.makedirs(folder, exist_ok=True)
    n, offset = len(readable), flip_offset(len(readable), seed)
    path = lambda k: os.path.join(image_root, records[k][1]["image_path"])
    for r, k in enumerate(readable[:count]):
        x, line = open_rgb(path(k)), records[k][0]
        made = {"original": x}
        for kind in kinds:
            if kind in FLIP_KINDS and offset is None:
                continue
            y = open_rgb(path(readable[partner(r, n, offset)])) if kind in FLIP_KINDS else None
            made[kind] = alter(x, kind, y, seed, r)
        for name, img in made.items():
            with atomic_open(os.path.join(folder, f"{line}_{name}.png"), "wb") as f:
                img.save(f, format="PNG")
    return folder
