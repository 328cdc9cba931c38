"""lgip.retrieval: retrieval beside LGIP (LGIP_SPEC.md section 7), from the embeddings an
evaluation computed: image-to-text and text-to-image recall, recall with the flips in the caption
gallery and how often the top-1 text is a flip (RoCOCO), whether a record prefers its own flip,
and whether a paraphrase finds the image its caption finds.

A `Gallery` holds the image embedding of every record whose image reads (file order) and a table
of text embeddings; its captions, flips, typed flips and paraphrases are `Items`: for each text,
its record's position among the images, its caption index and its row in the table. `search_galleries`
cuts the records into blocks of `size` and ranks each block's queries against that block alone,
a chunk of queries at a time on the embeddings' device: the memory is a chunk x a block's
gallery, never records x texts. Rank = 1 + the number of gallery items strictly more similar
(ties favour the correct item); a gallery text or image whose embedding occurs several times,
byte for byte (a caption repeated, two texts that tokenize alike, one image in two records), is
one column counted as often as it occurs, so its copies tie exactly. `retrieval_figures` turns the
ranks into the section 7 figures with bootstrap intervals.

Worked example: two records; image 0 = (1, 0) with caption a = (1, 0) and flip f = (.8, .6);
image 1 = (0, 1) with captions b = (.6, .8) and d = (s, s), s = 1/sqrt(2), flip g = (0, 1), and a
paraphrase p of d, p = (.6, .8). Image 1's best caption is b (.8) and no caption beats it
(recall@1 hit), but its flip g (1.0) does: with the flips in the gallery b ranks 2, and the
top-1 text is a flip. Caption d is as similar to image 0 as to its own (s = s): a tie, so its
image ranks 1; its most similar image is then image 0 (first on ties), while p's is image 1.
    >>> import torch
    >>> s = 0.5 ** 0.5
    >>> g = Gallery(images=torch.tensor([[1., 0.], [0., 1.]]),
    ...             texts=torch.tensor([[1., 0.], [.6, .8], [s, s], [.8, .6], [0., 1.]]),   # a, b (= p), d, f, g
    ...             captions=Items(pos=[0, 1, 1], row=[0, 1, 2], cap=[0, 0, 1]),
    ...             flips=Items(pos=[0, 1], row=[3, 4], cap=[0, 0]),
    ...             paraphrases=Items(pos=[1], row=[1], cap=[1]))
    >>> f = retrieval_figures(search_galleries(g, size=None), resamples=0)
    >>> f["i2t_recall@1"], f["i2t_flip_recall@1"], f["i2t_flip_top1_rate"], f["own_flip_preferred_rate"]
    (1.0, 0.5, 0.5, 0.5)
    >>> f["t2i_recall@1"], f["t2i_paraphrase_recall@1"], f["t2i_paraphrase_agreement@1"]
    (1.0, 1.0, 0.0)
"""

import time

from .errors import ConfigError
from .scoring import add_ci, mean_or_none


KS = (1, 5, 10)  # the k of every recall@k
CHUNK_ELEMENTS = {
    "cpu": 1 << 22,
    "cuda": 1 << 25,
}  # similarities per query chunk (float32: 16 MB on a CPU, 128 MB on a GPU)


class Items:
    """Texts of one kind, in record order: `pos` the record's position among the gallery's images,
    `row` the text's row in the table, `cap` its caption's index (-1 where it has none)."""

    def __init__(self, pos=(), row=(), cap=None):
        import numpy as np

        self.pos, self.row = np.asarray(pos, dtype=np.int64), np.asarray(row, dtype=np.int64)
        self.cap = np.full(len(self.pos), -1, dtype=np.int64) if cap is None else np.asarray(cap, dtype=np.int64)
        if not (len(self.pos) == len(self.row) == len(self.cap)):
            raise ValueError(f"Items: {len(self.pos)} positions, {len(self.row)} rows, {len(self.cap)} caption indices")
        if len(self.pos) and (np.diff(self.pos) < 0).any():
            raise ValueError("Items must be in record order")

    def __len__(self):
        return len(self.pos)

    def span(self, lo, hi):
        """The items of records lo..hi-1 (a block)."""
        import numpy as np

        a, b = np.searchsorted(self.pos, [lo, hi])
        return Items(self.pos[a:b] - lo, self.row[a:b], self.cap[a:b])


class Gallery:
    """Everything retrieval needs of one model's run: `images` [n, D] (one per record whose image
    reads, in file order), `texts` [m, D] (rows the Items point at), both L2-normalised on one
    device; `records` the file index of each image (for the bootstrap); `typed` {flip type: Items}
    (empty when the input has no typed lists)."""

    def __init__(self, images, texts, captions, flips, paraphrases, typed=None, records=None):
        import numpy as np

        self.images, self.texts = images, texts
        self.captions, self.flips, self.paraphrases, self.typed = captions, flips, paraphrases, dict(typed or {})
        self.records = (
            np.arange(len(images), dtype=np.int64) if records is None else np.asarray(records, dtype=np.int64)
        )

    @classmethod
    def from_pairs(cls, ok, img_emb, txt_emb, rows, captions, flips, typed, paraphrases, types):
        """A ModelRun's gallery: `ok` the records whose image read, `img_emb` [records, D] by record,
        `txt_emb` the text table and `rows` slot -> row (ModelRun.text_embeddings); the rest are
        Pairs (rec, cap, slot; typed flips labelled by type, `types` the ones to keep)."""
        import numpy as np
        import torch

        ok = np.asarray(sorted(ok), dtype=np.int64)
        pos_of = np.full(len(img_emb), -1, dtype=np.int64)  # record -> its image's place; -1: unreadable
        pos_of[ok] = np.arange(len(ok))

        def items(pairs, keep=None):
            pos = pos_of[np.asarray(pairs.rec, dtype=np.int64)]
            good = (pos >= 0) if keep is None else (pos >= 0) & keep
            slots = np.asarray(pairs.slot, dtype=np.int64)[good]
            return Items(pos[good], np.asarray(rows)[slots], np.asarray(pairs.cap, dtype=np.int64)[good])

        labels = np.asarray(typed.label, dtype=object)
        images = img_emb[torch.as_tensor(ok, device=img_emb.device)] if len(ok) else img_emb[:0]
        return cls(
            images,
            txt_emb,
            items(captions),
            items(flips),
            items(paraphrases),
            {t: items(typed, labels == t) for t in types},
            records=ok,
        )

    def to_host(self):
        """The same gallery on the CPU, its text table cut to the rows it uses (a torchrun process's
        part, to gather on rank 0)."""
        import numpy as np

        used = self._used_rows()
        part = self._renumbered(used, used, np.arange(len(used)))
        part.images, part.texts = part.images.cpu(), part.texts.cpu()
        return part

    def distinct(self):
        """The same gallery with each distinct text embedding once in its table, by its bytes
        (texts that tokenize alike, a caption that is also a flip: one row), only the rows its
        items use. A repeated text is then one column of a block's gallery, so its copies tie
        exactly: a matrix product need not give equal columns equal values."""
        used = self._used_rows()
        first, number = _distinct_rows(self.texts[_index(used, self.texts)])
        return self._renumbered(used, used[first], number)

    def _used_rows(self):
        import numpy as np

        kinds = [self.captions, self.flips, self.paraphrases, *self.typed.values()]
        return np.unique(np.concatenate([it.row for it in kinds])) if kinds else np.zeros(0, dtype=np.int64)

    def _renumbered(self, used, keep, number):
        """This gallery with the table texts[keep]: row used[i] (the rows its items use, ascending)
        becomes number[i]."""
        import numpy as np

        new = np.zeros(int(used.max()) + 1 if len(used) else 0, dtype=np.int64)
        new[used] = number
        moved = lambda it: Items(it.pos, new[it.row], it.cap)
        return Gallery(
            self.images,
            self.texts[_index(keep, self.texts)],
            moved(self.captions),
            moved(self.flips),
            moved(self.paraphrases),
            {t: moved(it) for t, it in self.typed.items()},
            self.records,
        )

    @classmethod
    def merged(cls, parts, device="cpu"):
        """One gallery from the parts of several processes (each from to_host), in record order
        (search_galleries makes its texts distinct, as in a single process)."""
        import numpy as np
        import torch

        records = np.concatenate([p.records for p in parts])
        order = np.argsort(records, kind="stable")
        new_pos = np.empty(len(records), dtype=np.int64)
        new_pos[order] = np.arange(len(records))
        pos_base = np.cumsum([0] + [len(p.records) for p in parts])
        row_base = np.cumsum([0] + [len(p.texts) for p in parts])

        def joined(get):
            its = [get(p) for p in parts]
            pos = np.concatenate([new_pos[it.pos + pos_base[j]] for j, it in enumerate(its)])
            row = np.concatenate([it.row + row_base[j] for j, it in enumerate(its)])
            cap = np.concatenate([it.cap for it in its])
            keep = np.argsort(pos, kind="stable")  # a record's items all come from one process, in its order
            return Items(pos[keep], row[keep], cap[keep])

        types = list(parts[0].typed)
        return cls(
            torch.cat([p.images for p in parts])[torch.as_tensor(order)].to(device),
            torch.cat([p.texts for p in parts]).to(device),
            joined(lambda p: p.captions),
            joined(lambda p: p.flips),
            joined(lambda p: p.paraphrases),
            {t: joined(lambda p, t=t: p.typed[t]) for t in types},
            records[order],
        )


def _index(rows, x):
    import torch

    return torch.as_tensor(rows, dtype=torch.int64, device=x.device)


def _distinct_rows(x, hashes=None):
    """_unique_first over the rows of x by their bytes, worked out where x is: two exact integer
    hashes of each row's bits (sums, so equal rows hash alike wherever they sit) are grouped on
    the host, then every row is compared with its group's first; were two distinct rows to hash
    alike (odds about 2**-60 a pair), the rows' bytes are grouped on the host instead."""
    import numpy as np
    import torch

    if len(x) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    bits = x.detach().contiguous().view(torch.int16)  # any float dtype: its bit pattern, 16 bits at a time
    h = (hashes or _row_hashes)(bits).cpu().numpy()
    first, number = _unique_first(
        np.ascontiguousarray(h).view(np.dtype((np.void, h.dtype.itemsize * h.shape[1]))).ravel()
    )
    lead = _index(first[number], bits)
    step = max(1, (1 << 24) // bits.shape[1])
    if all(bool((bits[a : a + step] == bits[lead[a : a + step]]).all()) for a in range(0, len(bits), step)):
        return first, number
    return _unique_first(_row_bytes(x))


def _row_hashes(bits):
    """[rows, 2] int64: each row's int16 values times fixed random weights below 2**30, summed
    (below 2**62 for rows of up to 2**17 values: no overflow, so the sums are exact)."""
    import torch

    weights = torch.randint(
        1, 1 << 30, (bits.shape[1], 2), generator=torch.Generator().manual_seed(0), dtype=torch.int64
    ).to(bits.device)
    step = max(1, (1 << 22) // bits.shape[1])
    return torch.cat(
        [
            torch.stack([(bits[a : a + step].long() * w).sum(dim=1) for w in weights.T], dim=1)
            for a in range(0, len(bits), step)
        ]
    )


def _row_bytes(x):
    """Each row of a tensor as one bytes value (equal rows, equal values)."""
    import numpy as np
    import torch

    x = x.detach().cpu()
    a = np.ascontiguousarray((x.view(torch.int16) if x.dtype == torch.bfloat16 else x).numpy())
    return a.view(np.dtype((np.void, a.dtype.itemsize * a.shape[1]))).ravel() if a.size else np.zeros(len(a), "V1")


def _unique_first(keys):
    """(index of each distinct key's first occurrence, in order of first occurrence; each key's
    number among them): distinct values numbered as they first appear."""
    import numpy as np

    if len(keys) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    number = np.empty(len(first), dtype=np.int64)
    number[order] = np.arange(len(first))
    return first[order], number[inverse.ravel()]


class _Columns:
    """A block's gallery of one or more kinds (captions, flips, each flip type; or images) as
    columns: each distinct vector once (`emb`, float32), so a text that is a caption and a flip
    gets one similarity, ordered so that the columns held by the same kinds are contiguous
    (`groups`: (start, end, kinds)): a kind's best and its count above a threshold are then a
    few slices of the similarities, never a copy. `col[k]`: each item's column, per kind;
    `extra[k]`: the columns a kind holds more than once, and how many times more."""

    def __init__(self, vectors, cols, device):
        import numpy as np
        import torch

        n = len(vectors)
        weight = np.stack([np.bincount(c, minlength=n) for c in cols], axis=1) if n else np.zeros((0, len(cols)), int)
        code = ((weight > 0) << np.arange(len(cols))).sum(axis=1)
        order = np.argsort(code, kind="stable")
        place = np.empty(n, dtype=np.int64)
        place[order] = np.arange(n)
        self.emb = vectors[torch.as_tensor(order, device=vectors.device)].to(device).float()
        self.col = [place[c] for c in cols]
        code, weight = code[order], weight[order]
        cut = np.flatnonzero(np.diff(code)) + 1
        self.groups = [(int(s), int(e), int(code[s])) for s, e in zip(np.r_[0, cut], np.r_[cut, n]) if e > s]
        self.extra = []
        for k in range(len(cols)):
            more = np.flatnonzero(weight[:, k] > 1)
            self.extra.append(
                (
                    torch.as_tensor(more, device=device),
                    torch.as_tensor((weight[more, k] - 1).astype(np.float32), device=device),
                )
            )

    def __len__(self):
        return len(self.emb)

    def best(self, group_max, k):
        """The most similar column of kind k per row, from each group's maxima (-inf: none)."""
        import torch

        got = [m for (_, _, code), m in zip(self.groups, group_max) if code >> k & 1]
        if not got:
            return torch.full((len(group_max[0]) if group_max else 0,), float("-inf"), device=self.emb.device)
        return torch.stack(got).amax(dim=0) if len(got) > 1 else got[0]

    def above(self, greater, k):
        """How many items of kind k (columns with their repeats) each row's `greater` mask holds."""
        import torch

        out = torch.zeros(len(greater), device=self.emb.device)
        for s, e, code in self.groups:
            if code >> k & 1:
                out += (
                    greater[:, s:e].view(torch.uint8).sum(dim=1)
                )  # (as bytes: several times faster than bool on a CPU)
        more, times = self.extra[k]
        if len(more):
            out += greater.index_select(1, more).float() @ times
        return out

    def maxima(self, sims):
        return [sims[:, s:e].amax(dim=1) for s, e, _ in self.groups]


def _own(items, col, n, device):
    """([records, most per record] the columns of each record's own items, -1 padded; whether it has any)."""
    import numpy as np
    import torch

    per = np.bincount(items.pos, minlength=n)
    starts = np.concatenate([[0], np.cumsum(per)[:-1]])
    own = np.full((n, int(per.max()) if len(col) else 0), -1, dtype=np.int64)
    own[items.pos, np.arange(len(col)) - starts[items.pos]] = col
    return torch.as_tensor(own, device=device), per > 0


def _own_max(sims, own):
    """Per query row, its most similar own item (-inf when it has none): taken from `sims`
    itself, so an item compares equal to itself."""
    import torch

    if own.shape[1] == 0:
        return torch.full((len(sims),), float("-inf"), device=sims.device)
    vals = sims.gather(1, own.clamp(min=0))
    return vals.masked_fill(own < 0, float("-inf")).amax(dim=1)


class Found:
    """What `search_galleries` found, per query: image queries (records with a caption) `img_pos`,
    `i2t_rank` (over C), `i2t_flip_rank` (over C + F), `flip_top1` (the top-1 text is a flip),
    `own_flip` / `has_own_flip`, and per type `typed[t]` = (top1, own, has); caption queries
    `cap_pos`, `t2i_rank`; paraphrase queries `para_pos`, `para_rank`, `para_agree`; plus the
    gallery's `records`, counts, and `seconds` per part of the search."""


def check_gallery_size(size):
    """GALLERY_SIZE: a positive int or None; else a ConfigError naming both."""
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise ConfigError(
            f"GALLERY_SIZE must be a positive int (records per gallery, 5000: the COCO 5k protocol) "
            f"or None (one gallery of all records), got {size!r}"
        )
    return size


def search_galleries(gallery, size=5000, chunk_elements=None):
    """Rank every query of `gallery` in blocks of `size` records (None: one block of all).
    Returns a Found (numpy arrays, in record order)."""
    import numpy as np
    import torch

    check_gallery_size(size)
    n = len(gallery.images)
    size = size or max(n, 1)
    device = gallery.images.device
    budget = chunk_elements or CHUNK_ELEMENTS.get(device.type, CHUNK_ELEMENTS["cuda"])
    t0 = time.perf_counter()
    gallery = gallery.distinct()
    distinct = time.perf_counter() - t0
    parts = []
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # similarities in float32, as section 7 says
    try:
        with torch.no_grad():
            for lo in range(0, n, size):
                parts.append(_block(gallery, lo, min(lo + size, n), device, budget))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    found = Found()
    for name in (
        "img_pos",
        "i2t_rank",
        "i2t_flip_rank",
        "flip_top1",
        "own_flip",
        "has_own_flip",
        "cap_pos",
        "t2i_rank",
        "para_pos",
        "para_rank",
        "para_agree",
    ):
        setattr(found, name, np.concatenate([p[name] for p in parts]) if parts else np.zeros(0, dtype=np.int64))
    found.typed = {
        t: tuple(
            np.concatenate([p["typed"][t][j] for p in parts]) if parts else np.zeros(0, dtype=bool) for j in range(3)
        )
        for t in gallery.typed
    }
    # where the time went (the text queries include their columns, images made distinct)
    found.seconds = {
        "distinct_texts": round(distinct, 3),
        **{k: round(sum(p["seconds"][k] for p in parts), 3) for k in ("columns", "image_queries", "text_queries")},
    }
    found.records, found.num_blocks, found.gallery_size = gallery.records, len(parts), min(size, n)
    found.num_captions, found.num_flips = len(gallery.captions), len(gallery.flips)
    return found


def _chunks(n, width, budget):
    step = max(1, budget // max(1, width))
    return [(a, min(a + step, n)) for a in range(0, n, step)]


def _block(g, lo, hi, device, budget):
    """The figures' raw material for the records lo..hi-1, searched against each other only."""
    import numpy as np
    import torch

    t0 = time.perf_counter()
    n = hi - lo
    caps, flips, paras = g.captions.span(lo, hi), g.flips.span(lo, hi), g.paraphrases.span(lo, hi)
    types = list(g.typed)
    kinds = [caps, flips] + [g.typed[t].span(lo, hi) for t in types]
    rows = np.concatenate([it.row for it in kinds])
    first, col = _unique_first(rows)  # a text that occurs in several places or kinds: one column
    bounds = np.cumsum([0] + [len(it) for it in kinds])
    texts = _Columns(
        g.texts[torch.as_tensor(rows[first], device=g.texts.device)],
        [col[bounds[k] : bounds[k + 1]] for k in range(len(kinds))],
        device,
    )
    own, has = zip(*(_own(it, texts.col[k], n, device) for k, it in enumerate(kinds)))
    C, F = 0, 1
    queries = np.flatnonzero(has[C])  # images with a caption of their own: they have a target
    q_dev = torch.as_tensor(queries, device=device)
    out = {k: [] for k in ("i2t_rank", "i2t_flip_rank", "flip_top1", "own_flip")}
    out_typed = [([], []) for _ in types]
    t1 = time.perf_counter()
    for a, b in _chunks(len(queries), 2 * len(texts), budget):  # the similarities and their comparison
        q = q_dev[a:b]
        sims = g.images[lo:hi][q].to(device).float() @ texts.emb.T
        target = _own_max(sims, own[C][q])  # the most similar own caption
        greater = sims > target[:, None]
        above_c = texts.above(greater, C)
        out["i2t_rank"].append(1 + above_c)
        out["i2t_flip_rank"].append(1 + above_c + texts.above(greater, F))
        del greater
        maxima = texts.maxima(sims)
        best_c = texts.best(maxima, C)
        out["flip_top1"].append(texts.best(maxima, F) > best_c)
        out["own_flip"].append(_own_max(sims, own[F][q]) > target)
        for j in range(len(types)):
            out_typed[j][0].append(texts.best(maxima, 2 + j) > best_c)
            out_typed[j][1].append(_own_max(sims, own[2 + j][q]) > target)
    nq = len(queries)
    res = {
        "img_pos": lo + queries,
        "i2t_rank": _host(out["i2t_rank"], nq).astype(np.int64),
        "i2t_flip_rank": _host(out["i2t_flip_rank"], nq).astype(np.int64),
        "flip_top1": _host(out["flip_top1"], nq).astype(bool),
        "own_flip": _host(out["own_flip"], nq).astype(bool),
        "has_own_flip": has[F][queries],
    }
    res["typed"] = {
        t: (_host(out_typed[j][0], nq).astype(bool), _host(out_typed[j][1], nq).astype(bool), has[2 + j][queries])
        for j, t in enumerate(types)
    }
    t2 = time.perf_counter()  # (the results on the host: the device's work is done)
    rank, best = _text_queries(g.texts, [caps, paras], g.images[lo:hi], device, budget)
    nc = len(caps)
    # a paraphrase's caption: the caption item of the same record and caption index
    span = int(max(caps.cap.max(initial=0), paras.cap.max(initial=0))) + 1
    cap_key, para_key = caps.pos * span + caps.cap, paras.pos * span + paras.cap
    at = np.minimum(np.searchsorted(cap_key, para_key), max(nc - 1, 0))
    if len(paras) and (nc == 0 or (cap_key[at] != para_key).any()):
        raise ValueError("a paraphrase whose caption is not among the gallery's captions")
    res.update(
        cap_pos=lo + caps.pos,
        t2i_rank=rank[:nc],
        para_pos=lo + paras.pos,
        para_rank=rank[nc:],
        para_agree=best[nc:] == best[:nc][at] if len(paras) else np.zeros(0, dtype=bool),
    )
    res["seconds"] = {"columns": t1 - t0, "image_queries": t2 - t1, "text_queries": time.perf_counter() - t2}
    return res


def _text_queries(table, kinds, images, device, budget):
    """Texts as queries over a block's images: (the rank of each text's own image, its most similar
    image: the first on ties, in block order). A text that occurs several times is one query."""
    import numpy as np
    import torch

    first_img, img_col = _distinct_rows(images)  # one image in two records: one column
    gallery = _Columns(images[torch.as_tensor(first_img, device=images.device)], [img_col], device)
    # (one kind: a single group, in block order of first occurrence, as argmax's ties need)
    rows = np.concatenate([it.row for it in kinds])
    first, u = _unique_first(rows)
    order = np.argsort(u, kind="stable")  # items by query, so a chunk of items needs a run of queries
    u_sorted = u[order]
    u_dev = torch.as_tensor(u_sorted, device=device)
    own = torch.as_tensor(gallery.col[0][np.concatenate([it.pos for it in kinds])[order]], device=device)
    q_rows = torch.as_tensor(rows[first], device=table.device)
    ranks, best = [], []
    for a, b in _chunks(len(order), 2 * len(gallery), budget):
        u0, u1 = int(u_sorted[a]), int(u_sorted[b - 1]) + 1
        sims = table[q_rows[u0:u1]].to(device).float() @ gallery.emb.T
        if u1 - u0 != b - a:  # a text asked more than once in this chunk: a row per item
            sims = sims.index_select(0, u_dev[a:b] - u0)
        ranks.append(1 + gallery.above(sims > sims.gather(1, own[a:b, None]), 0))
        best.append(sims.argmax(dim=1))
    back = np.empty(len(order), dtype=np.int64)
    back[order] = np.arange(len(order))
    return _host(ranks, len(order)).astype(np.int64)[back], _host(best, len(order)).astype(np.int64)[back]


def _host(pieces, n):
    import numpy as np
    import torch

    return torch.cat(pieces).cpu().numpy() if pieces else np.zeros(n)


def _rate(block, key, hits, records, resamples, seed):
    import numpy as np

    hits = np.asarray(hits, dtype=np.float64)
    block[key] = mean_or_none(hits)
    if resamples:
        add_ci(block, key, records, hits, resamples, seed)
    return block


def retrieval_compared(found):
    """The per-image values of the figures models are compared on (LGIP_SPEC.md sections 9 and 12):
    [(figure, each image query's record, its value)] for i2t_recall@1 and i2t_flip_top1_rate."""
    img = found.records[found.img_pos.astype(int)]
    return [("i2t_recall@1", img, found.i2t_rank <= 1), ("i2t_flip_top1_rate", img, found.flip_top1.astype(bool))]


def retrieval_figures(found, resamples=1000, seed=0):
    """The section 7 figures of a search, named as there, each rate with a `*_ci95` bootstrap
    interval over images (a caption or paraphrase query goes with its image; resamples 0: none)."""
    rec = found.records
    img, cap, para = rec[found.img_pos.astype(int)], rec[found.cap_pos.astype(int)], rec[found.para_pos.astype(int)]
    with_flip = found.has_own_flip.astype(bool)
    m = {
        "num_samples": int(len(found.img_pos)),
        "gallery_size": int(found.gallery_size),
        "num_blocks": int(found.num_blocks),
        "num_captions": int(found.num_captions),
        "num_flips": int(found.num_flips),
        "num_paraphrases": int(len(found.para_pos)),
        "num_images_with_flips": int(with_flip.sum()),
    }
    for k in KS:
        _rate(m, f"i2t_recall@{k}", found.i2t_rank <= k, img, resamples, seed)
    for k in KS:
        _rate(m, f"t2i_recall@{k}", found.t2i_rank <= k, cap, resamples, seed)
    for k in KS:
        _rate(m, f"i2t_flip_recall@{k}", found.i2t_flip_rank <= k, img, resamples, seed)
    _rate(m, "i2t_flip_top1_rate", found.flip_top1, img, resamples, seed)
    _rate(m, "own_flip_preferred_rate", found.own_flip[with_flip], img[with_flip], resamples, seed)
    _rate(m, "t2i_paraphrase_recall@1", found.para_rank <= 1, para, resamples, seed)
    _rate(m, "t2i_paraphrase_agreement@1", found.para_agree, para, resamples, seed)
    if found.typed:
        m["by_flip_type"] = {}
        for t, (top1, own, has) in found.typed.items():
            has = has.astype(bool)
            block = _rate({}, "i2t_flip_top1_rate", top1[has], img[has], resamples, seed)
            _rate(block, "own_flip_preferred_rate", own[has], img[has], resamples, seed)
            block["count"] = int(has.sum())
            m["by_flip_type"][t] = block
    return m
