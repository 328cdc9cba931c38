"""lgip.texts: the texts of an evaluation: its published calls (`TextCalls`), deduplicated and
each padded as its call pads it, tokenized once, encoded in large batches grouped by padded
length or packed by shared prefix (`TextBank`); what a run's models share of them (`RunCalls`).

    >>> bank = TextBank(enc)
    >>> slots = bank.add_call(["a red bus", "a blue bus"])   # one published call
    >>> emb, rows = bank.encode(batch_size=512)             # emb[rows[slots]] are the vectors
"""

import time

from . import accelerations
from .memory import KEPT
from .models import prefix_packs
from .errors import ModelError
from .util import default_num_workers, progress
from .tokens import TokenTable, _TextChunks, _identity, padded_ids, shared_token_table
from .device import _DeviceRows, _Rows, _upload_in_groups


def resolve_text_batch_size(value, device):
    """TEXT_BATCH_SIZE constant -> int: "auto" = 2048 on CUDA (fewer, larger launches), 64 on
    CPU (measured fastest there, benchmarks/BENCHMARKS.md)."""
    if value in (None, "auto"):
        return 2048 if str(device).startswith("cuda") else 64
    if not isinstance(value, int) or value < 1:
        raise ModelError(f"TEXT_BATCH_SIZE must be a positive int or 'auto', got {value!r}")
    return value


class TextCalls:
    """A TextBank's calls, flat: every call's texts one after another (`texts`; a text's slot is
    its place there) and where each call starts (`starts`). A tuple and a list per call made
    ~5M objects for the rebuttal's 2.6M calls at 40,000 records, which Python's garbage
    collector walked again and again: half the time of building the pairs.
    >>> calls = TextCalls(); calls.add(["a", "b"]); calls.add(["c"]); list(calls)
    [(0, ['a', 'b']), (2, ['c'])]
    """

    def __init__(self, texts=(), starts=(), captions=None):
        self.texts, self.starts = list(texts), list(starts)
        self.captions = dict(captions or {})  # record index -> its captions' slots (add_call's captions_of)

    def add(self, texts):
        self.starts.append(len(self.texts))
        self.texts.extend(texts)

    def add_call(self, texts, batch=None, captions_of=None):
        """Register one published `encode_text` call; returns a slot per text. An empty list
        makes no call (as published). batch: the published script's text batch inside a call
        (64, or 512 in the rebuttal): each batch of the call is padded on its own. captions_of:
        the record index whose captions these texts are (the relative invariance error's
        denominator scores every caption, LGIP_SPEC.md 13: `captions`).
        >>> calls = TextCalls(); calls.add_call(["a", "b", "c"], batch=2), len(calls)
        ([0, 1, 2], 2)
        """
        first = len(self.texts)
        step = batch or len(texts)
        for b in range(0, len(texts), max(step, 1)):
            self.add(texts[b : b + step])
        slots = list(range(first, len(self.texts)))
        if captions_of is not None:
            self.captions[captions_of] = slots
        return slots

    def __iter__(self):
        """(first slot, texts) per call."""
        for n, first in enumerate(self.starts):
            yield first, self.texts[first : self.starts[n + 1] if n + 1 < len(self.starts) else len(self.texts)]

    def __len__(self):
        return len(self.starts)

    def __eq__(self, other):
        return isinstance(other, TextCalls) and self.starts == other.starts and self.texts == other.texts

    def copy(self):
        return TextCalls(self.texts, self.starts, self.captions)


class RunCalls:
    """An evaluation's text calls and pairs, built once per run: they depend on the records
    alone, so every model of the run adopts them (ModelRun.pairs), with what its TextBank
    derives from them: the keys of each padding and their rows in each token table (building
    and deriving took ~4 s per model at 40,000 images)."""

    def __init__(self, calls, pairs):
        self.calls, self.pairs = calls, pairs
        self.keys = {}  # TextBank._padding() -> (keys, slot -> key row)
        self.table_rows = {}  # (id(token table), TextBank._padding()) -> (the table, each key's row in it)


class TextBank:
    """Texts to encode, deduplicated, each padded exactly as the call it belongs to pads it.

    Register every text call first (`add_call` returns one slot id per text), then `encode`
    once: unique (text, padded length) pairs are tokenized in one pass and encoded in large
    batches grouped by padded length, so batching never changes an embedding.
    >>> bank = TextBank(enc)
    >>> slots = bank.add_call(["a red bus", "a blue bus"])   # one published call
    >>> emb, rows = bank.encode(batch_size=512)             # emb[rows[slots]] are the vectors
    """

    def __init__(self, enc, num_workers=0):
        self.enc, self.num_workers = enc, default_num_workers() if num_workers is None else num_workers
        self.calls = TextCalls()
        self.run_calls = None  # the RunCalls these calls are, once shared by the models of a run
        self.n_unique = self.n_encoded = 0
        self.seconds = {}  # wall-clock time of encode's phases: where a run's time went
        self.positions = {}  # token positions of the encoded texts, and how many were computed (prefix sharing)

    @property
    def n_slots(self):
        return len(self.calls.texts)

    def add_call(self, texts, batch=None):
        """Register one published `encode_text` call (TextCalls.add_call); returns a slot per text."""
        return self.calls.add_call(texts, batch)

    def _tokenize(self, texts, tokens, chunk=2048):
        """Add the texts not yet in `tokens` (a TokenTable); large jobs in DataLoader worker
        processes (tokenizers are pure Python and would otherwise bound a GPU run). Returns the
        seconds spent forking those workers (a cost per run, not per text: reported apart)."""
        import torch

        texts = [t for t in dict.fromkeys(texts) if t not in tokens]
        if not texts:
            return 0.0
        chunks = _TextChunks(texts, self.enc.tokenize, chunk)
        workers = self.num_workers if len(texts) > 8 * chunk else 0
        loader = torch.utils.data.DataLoader(chunks, batch_size=None, num_workers=workers, collate_fn=_identity)
        t0 = time.perf_counter()
        loader = iter(loader)  # forks the workers
        forks = time.perf_counter() - t0
        for n, (flat, lengths) in enumerate(
            progress(loader, total=len(chunks), desc=f"{self.enc.name}: tokenize", unit="chunk", min_total=50)
        ):
            tokens.add(texts[n * chunk : (n + 1) * chunk], flat, lengths)
        return forks

    def adopt(self, run_calls):
        """Take a RunCalls' calls as this bank's (made for another model of the run)."""
        self.calls, self.run_calls = run_calls.calls.copy(), run_calls

    def _padding(self):
        """What a text's padding depends on: one length for all, or (published SigLIP) the token
        lengths of its call under this tokenizer; None when that cannot be shared."""
        if not self.enc.pad_needs_lengths:
            return "fixed", self.enc.pad_length(None)
        return ("lengths", self.enc.tokenizer_key) if self.enc.tokenizer_key is not None else None

    def _keys(self, tokens):
        """(unique (text, padded length) keys, the slot -> key row map, seconds forking
        tokenizers). The same for every model of a run that pads alike: made once for its
        RunCalls (a call padded to its longest text needs its texts tokenized first)."""
        padding = self._padding()
        shared = self.run_calls is not None and padding is not None
        if shared and padding in self.run_calls.keys:
            return (*self.run_calls.keys[padding], 0.0)
        forks = 0.0
        if self.enc.pad_needs_lengths:  # published SigLIP padding: the call's longest text
            forks = self._tokenize(self.calls.texts, tokens)
        keys, rows = self._make_keys(tokens)
        if shared:
            self.run_calls.keys[padding] = keys, rows
        return keys, rows, forks

    def _make_keys(self, tokens):
        import numpy as np

        key_row, keys = {}, []
        rows = np.empty(self.n_slots, dtype=np.int64)
        fixed = None if self.enc.pad_needs_lengths else self.enc.pad_length(None)
        lengths = tokens.packed()[2] if self.enc.pad_needs_lengths else None
        for first, texts in self.calls:
            if not texts:
                continue
            pad = (
                self.enc.pad_length([int(lengths[tokens.row[t]]) for t in texts])
                if self.enc.pad_needs_lengths
                else fixed
            )
            for j, t in enumerate(texts):
                key = (t, pad)
                row = key_row.get(key)
                if row is None:
                    row = key_row[key] = len(keys)
                    keys.append(key)
                rows[first + j] = row
        return keys, rows

    def _cache_keys(self, keys):
        """The cache's key of each (text, padded length) key: this family's tag, the padding, the text."""
        tag = self.enc.text_key_tag
        return [f"{tag}{pad if pad is not None else '-'}|{t}" for t, pad in keys]

    def _tokens(self):
        key = self.enc.tokenizer_key
        return shared_token_table(key) if key is not None else TokenTable()

    def cache_keys(self):
        """The cache's keys of these calls' unique texts: known before the model's weights are loaded,
        which a re-run whose texts are all cached never needs (lgip.scorers.cached)."""
        keys, _, _ = self._keys(self._tokens())
        return self._cache_keys(keys)

    def encode(self, batch_size=512, desc="texts", cache=None, beside=None, then=None):
        """([unique keys, D] float32 embeddings, slot -> row). `beside`: an ImageEncoding
        started once the texts are tokenized and polled between text batches; `then`: called
        at that point too, when there are texts to encode (ModelRun starts a Lookahead)."""
        import numpy as np

        tokens = self._tokens()
        t0 = time.perf_counter()
        keys, rows, forks = self._keys(tokens)
        out = _Rows(len(keys), 0.0, self.enc.device, self.enc.storage_dtype)
        todo = list(range(len(keys)))
        if cache:  # (a ModelCache; None or NoCache: nothing to look up)
            cache_keys = self._cache_keys(keys)
            hit_pos, hit_emb = cache.lookup("text", cache_keys)
            if hit_pos:
                out.put(hit_pos, hit_emb)
            hits = set(hit_pos)
            todo = [k for k in todo if k not in hits]
        # Rows of every key in the token table: known when another model of the run with this
        # table and padding had them (nothing to tokenize or look up), else found after tokenizing.
        padding = self._padding()
        known = self.run_calls.table_rows.get((id(tokens), padding)) if self.run_calls else None
        if known is None or known[0] is not tokens:
            forks += self._tokenize((keys[k][0] for k in todo), tokens)
        packs = (
            accelerations.PREFIX_PACKS
            and prefix_packs.PACK_NODES > 0
            and self.enc.encode_packs is not None
            and bool(todo)
            and all(keys[k][1] is None for k in todo)
        )
        writer = cache.writer("text") if cache and todo else None
        rows_out = _DeviceRows(self.enc, out, writer, cache_keys.__getitem__ if writer is not None else None)
        t_start = time.perf_counter()
        if beside is not None:
            beside.start()  # after the tokenizer's worker processes are done
        if then is not None and todo:
            then()
        t1 = time.perf_counter()
        if known is not None and known[0] is tokens:
            todo_rows = known[1][np.asarray(todo, dtype=np.int64)]
        else:
            todo_rows = np.fromiter((tokens.row[keys[k][0]] for k in todo), dtype=np.int64, count=len(todo))
            if self.run_calls is not None and len(todo) == len(keys) and padding is not None:
                self.run_calls.table_rows[(id(tokens), padding)] = (tokens, todo_rows)
        held = int(tokens.packed()[2][todo_rows].sum())
        if packs:  # planned while the image decoders start their work
            plan = self._plan(tokens, todo_rows, batch_size)
            self.positions = {"tokens": held, "computed": plan.n_nodes}
            n_batches, uploaded = -(-plan.n_packs // plan.packs_per_batch), self._packs_on_device(plan, todo)
        else:
            batches, texts_of = self._batches(todo, keys, tokens, batch_size, todo_rows)
            self.positions = {"tokens": held, "computed": held}  # (texts padded longer compute their padding too)
            n_batches, uploaded = len(batches), self._on_device(batches, texts_of, tokens)
        try:
            for batch, inputs in progress(
                uploaded, total=n_batches, desc=f"{self.enc.name}: {desc}", unit="batch", min_total=20
            ):
                rows_out.add(batch, self.enc.encode_packs(*inputs) if packs else self.enc.encode_tokens(*inputs))
                if beside is not None:
                    beside.poll()
            rows_out.flush()
        except BaseException as e:  # Ctrl-C, SIGTERM: the rows encoded so far go to the cache (the re-run resumes)
            rows_out.stop(keep=isinstance(e, KeyboardInterrupt))
            raise
        if writer is not None:
            writer.close()
        self.seconds = {
            "lookup_and_tokenize": round(t_start - t0 - forks, 3),
            "start_tokenizers": round(forks, 3),
            "start_images": round(t1 - t_start, 3),
            "texts": round(time.perf_counter() - t1, 3),
        }
        self.n_unique, self.n_encoded = len(keys), len(todo)
        return out.tensor(), rows

    @staticmethod
    def _batches(todo, keys, tokens, batch_size, text_row=None):
        """(batches, [(token table rows, padded length)] per batch): lists of at most batch_size
        keys sharing one padded length, padded keys first (by padding, then length), then the
        keys that may be cut to their batch's longest (pad None), grouped by exact token length:
        no padding at all. Stable: equal keys keep their order. text_row: the token-table row
        of each todo key, when the caller has them."""
        import numpy as np

        if text_row is None:
            text_row = np.fromiter((tokens.row[keys[k][0]] for k in todo), dtype=np.int64, count=len(todo))
        lengths = tokens.packed()[2][text_row]
        pads = np.fromiter((-1 if keys[k][1] is None else keys[k][1] for k in todo), dtype=np.int64, count=len(todo))
        cut = pads < 0
        group_length = np.where(cut, lengths, pads)
        order = np.lexsort((lengths, group_length, cut))  # the last key sorts first
        todo_sorted = np.asarray(todo, dtype=np.int64)[order]
        starts = np.flatnonzero((np.diff(cut[order]) != 0) | (np.diff(group_length[order]) != 0)) + 1
        batches, texts_of = [], []
        for lo, hi in zip(np.concatenate([[0], starts]), np.concatenate([starts, [len(todo)]])):
            for b in range(lo, hi, batch_size):
                sel = order[b : min(b + batch_size, hi)]
                batch = todo_sorted[b : min(b + batch_size, hi)].tolist()
                texts_of.append((text_row[sel], None if cut[sel[0]] else int(pads[sel[0]])))
                batches.append(batch)
        return batches, texts_of

    def _ids(self, text_rows, pad, tokens):
        """[n, L] int64 token ids of one batch: its texts' ids, padded to `pad` or, when None,
        cut to its longest text."""
        flat, starts, lengths = tokens.packed()
        lengths = lengths[text_rows]
        return padded_ids(
            flat, starts[text_rows], lengths, pad if pad is not None else int(lengths.max()), self.enc.pad_id
        )

    def _on_device(self, batches, texts_of, tokens, max_tokens=1 << 23):
        """(batch, (its token ids on the device, whether all its texts have the batch's exact
        length)) for each batch; the ids of several batches travel in one copy (_upload_in_groups)."""
        items = (
            ((batch, texts_of[n][1] is None), [self._ids(*texts_of[n], tokens)]) for n, batch in enumerate(batches)
        )
        for (batch, exact), (ids,) in _upload_in_groups(items, self.enc.device, max_tokens):
            yield batch, (ids, exact)

    @staticmethod
    def _plan(tokens, rows, batch_size):
        """PrefixPacks of these token-table rows; the last plan is kept, so the next model of a
        family (the paper's five open_clip models tokenize alike) encoding the same texts
        does not sort and pack them again (~2 s per 1.7M texts)."""
        import hashlib

        size = max(prefix_packs.PACK_NODES, int(tokens.packed()[2][rows].max()))  # a pack holds at least one whole text
        ppb = max(1, batch_size * prefix_packs.PACK_TOKENS_PER_TEXT // size)
        key = (hashlib.sha1(rows.tobytes()).hexdigest(), size, ppb)  # a table only grows: a row's ids never change
        last = KEPT.plan
        if accelerations.SHARED_TOKENS and last is not None and last[0][0] is tokens and last[0][1:] == key:
            return last[1]
        plan = prefix_packs.PrefixPacks(
            *tokens.packed(), rows, size=size, packs_per_batch=ppb, sort_columns=prefix_packs.PACK_SORT_COLUMNS
        )
        KEPT.plan = ((tokens, *key), plan) if accelerations.SHARED_TOKENS else None
        return plan

    def _packs_on_device(self, plan, todo, max_ints=1 << 23):
        """(batch, its PrefixPacks arrays on the device) per batch of the plan, the arrays of
        several batches travelling in one copy (_upload_in_groups)."""
        import numpy as np

        todo = np.asarray(todo, dtype=np.int64)
        yield from _upload_in_groups(
            ((todo[where].tolist(), arrays) for where, arrays in plan.batches()), self.enc.device, max_ints
        )
