"""lgip.models.prefix_packs: texts of a causal text tower packed as prefix trees, so a shared start
("a photo of a ...") is computed once (accelerations.PREFIX_PACKS); the tree mask each pack's
attention uses. Exact: a position attends only to the positions before it on its own text's path."""

from ..tokens import padded_ids


# tree nodes per prefix pack: larger shares a little more (1-2%), but its dense [M, M] tree mask costs attention FLOPs
# (~6% of a pack's at 128 on ViT-B-16 text, ~11% at 256); 0: no prefix packs (exact-length batches)
PACK_NODES = 128


# texts are ordered by their first 12 ids (24 shared 0.1% more positions on the bench's texts, for 1.8 s more per
# 1.7M texts)
PACK_SORT_COLUMNS = 12


# packs per batch = TEXT_BATCH_SIZE * this / PACK_NODES (a batch holds about as many positions as before)
PACK_TOKENS_PER_TEXT = 16


class PrefixPacks:
    """Texts of a causal text tower packed as prefix trees: a shared token prefix is computed once.

    Under a causal mask the state of position p depends only on tokens 0..p, so texts that
    start alike ("a photo of a ...", a caption and its flips) can share those positions. Texts
    are sorted by their token ids (so a text's longest shared prefix is with the text before
    it) and cut into packs of at most `size` tree nodes; every node attends to its ancestors
    and itself (the tree mask), at the position of its depth. Embeddings equal the plain
    causal computation up to float rounding; nothing is approximated. On COCO-like texts
    about 40% of the token positions are shared prefixes.
    >>> plan = PrefixPacks(flat, starts, lengths, rows, size=128, packs_per_batch=8)
    >>> for texts, arrays in plan.batches(): emb = enc.encode_packs(*arrays)  # rows of `texts`
    """

    def __init__(self, flat, starts, lengths, rows, size=128, packs_per_batch=8, sort_columns=24):
        import numpy as np

        rows = np.asarray(rows, dtype=np.int64)
        lens = lengths[rows]
        if len(rows) and int(lens.max()) > size:
            raise ValueError(f"pack size {size} is below the longest text ({int(lens.max())} tokens)")
        self.flat, self.starts = flat, starts
        # Sorted by the first sort_columns ids (beyond them texts rarely share), several ids
        # packed in each sort key: any order is correct, since a text only takes from the
        # text before it what the two truly share.
        bits = int(flat.max() + 2).bit_length() if len(flat) else 1
        per_key = max(1, 63 // bits)
        keys = []
        for c0 in range(0, min(int(lens.max()) if len(rows) else 0, sort_columns), per_key):
            key = np.zeros(len(rows), dtype=np.int64)
            for c in range(c0, min(c0 + per_key, sort_columns)):
                ids = np.where(lens > c, flat[starts[rows] + np.minimum(c, lens - 1)] + 1, 0)  # past the end: 0, first
                key = (key << bits) | ids
            keys.append(key)
        order = np.lexsort(keys[::-1]) if keys else np.arange(len(rows))
        self.rows, self.lens, self.order = rows[order], lens[order], order
        # Common prefix with the text before, a column at a time over the pairs still equal.
        begin = starts[self.rows]
        lcp = np.zeros(len(rows), dtype=np.int64)
        live = np.arange(1, len(rows))
        live = live[np.minimum(self.lens[live], self.lens[live - 1]) > 0]
        c = 0
        while len(live):
            same = flat[begin[live] + c] == flat[begin[live - 1] + c]
            live = live[same]
            lcp[live] += 1
            c += 1
            live = live[np.minimum(self.lens[live], self.lens[live - 1]) > c]
        # Greedy packs over the sorted texts (a pack's first text brings its whole path): a
        # pack starting at text a ends at the last b with lens[a] + new nodes of a+1..b <= size.
        total = np.cumsum(self.lens - lcp)
        pack = np.empty(len(rows), dtype=np.int64)
        shared = lcp
        a = g = 0
        while a < len(rows):
            b = int(np.searchsorted(total, size - int(self.lens[a]) + int(total[a]), side="right"))
            pack[a:b] = g
            shared[a] = 0
            a, g = b, g + 1
        self.pack, self.shared, self.size, self.packs_per_batch = pack, shared, size, packs_per_batch
        self.n_packs = g
        self.n_tokens, self.n_nodes = int(self.lens.sum()), int((self.lens - shared).sum())

    def batches(self):
        """(positions into `rows` of the batch's texts, (tok, pos, path, creator, eot, slot)):
        tok/pos/creator [G, size] per node (token id, depth, batch-local text that created it);
        path [T, L] node index of each text's token at each depth (0 past its end); eot [G, E]
        the nodes where the pack's texts end (their pooled position); slot [T] each text's
        place in eot.flatten(). Pad nodes: token 0, depth 0, creator -1."""
        import numpy as np

        bounds = np.r_[np.searchsorted(self.pack, np.arange(0, self.n_packs, self.packs_per_batch)), len(self.pack)]
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            yield self.order[lo:hi], self._arrays(lo, hi)

    def _arrays(self, lo, hi):
        import numpy as np

        lens, shared, pack = self.lens[lo:hi], self.shared[lo:hi], self.pack[lo:hi]
        pack = pack - pack[0]
        n_texts, width = len(lens), int(lens.max())
        ids = padded_ids(self.flat, self.starts[self.rows[lo:hi]], lens, width, -1)
        new = lens - shared
        first = np.r_[True, pack[1:] != pack[:-1]]
        off = np.cumsum(new) - new  # batch-wide offset of each text's first new node
        off = off - np.maximum.accumulate(np.where(first, off, 0))  # ... within its pack
        # path[t, p]: the text that created the node of (t, p) is the last s <= t with shared[s] <= p.
        t_idx = np.arange(n_texts)
        src = np.maximum.accumulate(np.where(shared[:, None] <= np.arange(width)[None, :], t_idx[:, None], -1), axis=0)
        cols = np.arange(width)[None, :]
        path = off[src] + cols - shared[src]
        path = np.where(cols < lens[:, None], path, 0)
        n_packs = int(pack[-1]) + 1
        tok = np.zeros((n_packs, self.size), dtype=np.int64)
        pos = np.zeros((n_packs, self.size), dtype=np.int64)
        creator = np.full((n_packs, self.size), -1, dtype=np.int64)
        creator_t = np.repeat(t_idx, new)
        start = np.cumsum(new) - new
        depth = np.arange(int(new.sum())) - start[creator_t] + shared[creator_t]
        node = off[creator_t] + depth - shared[creator_t]
        tok[pack[creator_t], node] = ids[creator_t, depth]
        pos[pack[creator_t], node] = depth
        creator[pack[creator_t], node] = creator_t
        eot_node = path[t_idx, lens - 1]
        per_pack = np.bincount(pack, minlength=n_packs)
        rank = t_idx - (np.cumsum(per_pack) - per_pack)[pack]
        eot = np.zeros((n_packs, int(per_pack.max())), dtype=np.int64)
        eot[pack, rank] = eot_node
        slot = pack * eot.shape[1] + rank
        return tok, pos, path, creator, eot, slot


def prefix_tree_mask(pos, path, creator):
    """[G, M, M] bool: node j is an ancestor of node i (or i itself), from PrefixPacks arrays
    on any device. i's ancestor at depth d is path[creator[i], d]; pad nodes see themselves."""
    import torch

    g, m = pos.shape
    valid = creator >= 0
    anc = path[creator.clamp(min=0)]  # [G, M, L]
    at = torch.gather(anc, 2, pos[:, None, :].expand(g, m, m).clamp(max=anc.shape[2] - 1))
    mask = (at == torch.arange(m, device=pos.device)) & (pos[:, None, :] <= pos[:, :, None])
    mask &= valid[:, None, :] & valid[:, :, None]
    return mask | torch.eye(m, dtype=torch.bool, device=pos.device)
