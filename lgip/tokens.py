"""lgip.tokens: token ids of many texts in one flat table (`TokenTable`), tokenized in worker
processes, and the table shared by the models of a process that tokenize alike
(accelerations.SHARED_TOKENS: the paper's five open_clip models tokenize each text once).

    >>> table = shared_token_table(enc.tokenizer_key); table.add(texts, *_pack(enc.tokenize(texts)))
"""

import itertools

from . import accelerations
from .memory import KEPT


def shared_token_table(key):
    """The TokenTable of one tokenization (`Encoder.tokenizer_key`: the tokenizer's class, vocab
    size, length limit, casing, and its ids for probe texts), shared by the models of a process
    that tokenize alike (the paper's five open_clip models tokenize each text once). One table
    is kept at a time."""
    if not accelerations.SHARED_TOKENS:
        return TokenTable()
    tables = KEPT.token_tables
    if key not in tables:
        tables.clear()
        tables[key] = TokenTable()
    return tables[key]


def install_token_table(key, table):
    """Make `table` (filled ahead, see Lookahead) the shared table of its tokenization."""
    if not accelerations.SHARED_TOKENS:
        return
    KEPT.token_tables.clear()
    KEPT.token_tables[key] = table


def _identity(x):
    return x


def padded_ids(flat, starts, lengths, width, fill):
    """[len(starts), width] int64 token ids: text i is flat[starts[i]:starts[i] + lengths[i]],
    cut to width or filled up with `fill`.
    >>> padded_ids(np.array([5, 6, 7, 8]), np.array([0, 2]), np.array([2, 2]), 3, -1)  # [[5, 6, -1], [7, 8, -1]]
    """
    import numpy as np

    cols = np.arange(width)
    if (lengths == width).all():
        return flat[starts[:, None] + cols]
    ids = np.full((len(starts), width), fill, dtype=np.int64)
    keep = cols[None, :] < np.minimum(lengths, width)[:, None]
    ids[keep] = flat[(starts[:, None] + cols)[keep]]
    return ids


def _pack(seqs):
    """Token id lists -> (flat int64 ids, int64 lengths): compact to pickle and to index."""
    import numpy as np

    lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=int(lengths.sum()))
    return flat, lengths


class _TextChunks:
    """Dataset of tokenized chunks of a text list, packed (workers inherit the tokenizer by fork)."""

    def __init__(self, texts, tokenize, chunk):
        self.texts, self.tokenize, self.chunk = texts, tokenize, chunk

    def __len__(self):
        return -(-len(self.texts) // self.chunk)

    def __getitem__(self, n):
        return _pack(self.tokenize(self.texts[n * self.chunk : (n + 1) * self.chunk]))


class TokenTable:
    """Token ids of many texts in one flat array: `row[text]` -> a row whose ids are
    flat[starts[row]:starts[row] + lengths[row]].
    >>> table = TokenTable(); table.add(["a dog"], *_pack([[49406, 320, 1929, 49407]]))
    >>> table.ids("a dog")   # array([49406, 320, 1929, 49407])
    """

    def __init__(self):
        import numpy as np

        self.row = {}
        self.flat, self.starts, self.lengths = (np.empty(0, dtype=np.int64) for _ in range(3))
        self._parts = []

    def __contains__(self, text):
        return text in self.row

    def __len__(self):
        return len(self.row)

    def add(self, texts, flat, lengths):
        for t in texts:
            self.row[t] = len(self.row)
        self._parts.append((flat, lengths))

    def packed(self):
        """(flat, starts, lengths) over every text added so far."""
        import numpy as np

        if self._parts:
            flats, lens = zip(*self._parts)
            self.flat = np.concatenate([self.flat, *flats])
            self.lengths = np.concatenate([self.lengths, *lens])
            self.starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
            self._parts = []
        return self.flat, self.starts, self.lengths

    def ids(self, text):
        flat, starts, lengths = self.packed()
        r = self.row[text]
        return flat[starts[r] : starts[r] + lengths[r]]
