"""lgip.device: embedding tables on the model's device, filled without waiting for it, and
cosine similarities computed there (accelerations.DEVICE_TABLES: else on the host)."""

import sys
import time

from . import accelerations


class _DeviceRows:
    """Embeddings computed on the device, put into a table on the device (`out`, a _Rows)
    every `flush_rows` rows, and handed to the cache writer (if any), which copies them to the
    host in its own thread. Nothing here waits for the device: the GPU queue never drains
    while the host prepares the next batch (a copy to the host per flush did: with the table
    on the host, rounding and storing 1.7M texts' rows took ~6 s of a 40,000-image run's host
    time per model, and scoring them there ~12 s).
    >>> rows = _DeviceRows(enc, out, writer, keys.__getitem__); rows.add(idx, emb); rows.flush()
    """

    def __init__(self, enc, out, writer=None, key_of=None, flush_rows=16384):
        if writer is not None:  # a cache chunk is written as soon as it is full (resume granularity)
            flush_rows = min(flush_rows, writer.cache.chunk_rows)
        self.enc, self.out, self.writer, self.key_of, self.flush_rows = enc, out, writer, key_of, flush_rows
        self.items, self.n, self.since = [], 0, time.monotonic()

    def add(self, idx, emb):
        self.items.append((list(idx), emb))
        self.n += len(idx)
        # (the cache's time bound: rows whose work began CACHE_FLUSH_S ago go to disk now)
        if self.n >= self.flush_rows or (self.writer is not None and self.writer.due(self.since)):
            self.flush()

    def flush(self):
        import torch

        if not self.items:
            return
        idx = [i for ii, _ in self.items for i in ii]
        emb = torch.cat([e for _, e in self.items]).to(self.enc.storage_dtype)
        self.out.put(idx, emb)
        if self.writer is not None:
            self.writer.add([self.key_of(i) for i in idx], emb, self.since)
        self.items, self.n, self.since = [], 0, time.monotonic()

    def stop(self, keep):
        """The work stopped early. keep (Ctrl-C, SIGTERM): every row encoded so far is written to
        the cache, so that the same command resumes after them; else (a failure, whose rows may come
        from a broken device) only the chunks already handed over are."""
        if self.writer is None:
            return
        try:
            if keep:
                self.flush()
                self.writer.close()
        except BaseException as e:  # (a second Ctrl-C; a failed write): what is whole is kept
            print(f"warning: the last rows encoded were not all cached ({type(e).__name__}: {e})", file=sys.stderr)
        finally:
            self.writer.abandon()


def _to_device(host, device):
    """A host tensor copied to `device` without waiting for the device: through pinned memory,
    non-blocking (a copy from pageable memory waits for the device's queue to drain; the pinned
    copy is kept by torch until the transfer is done)."""
    import torch

    if torch.device(device).type != "cuda" or not accelerations.DEVICE_TABLES:
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def _index_on(idx, device):
    """A LongTensor of idx on `device`, without waiting for the device."""
    import torch

    return _to_device(torch.as_tensor(idx, dtype=torch.long), device)


class _Rows:
    """A [n, D] table filled in pieces, on `device` in `dtype`; D is learnt from the first piece.
    Should the device have no room for it, it is made on the host instead (and says so)."""

    def __init__(self, n, fill=0.0, device="cpu", dtype=None):
        import torch

        device = device if accelerations.DEVICE_TABLES else "cpu"
        self.n, self.fill, self.device, self.dtype, self.data = n, fill, torch.device(device), dtype, None

    def put(self, idx, vectors):
        import torch

        if self.data is None:
            dtype = self.dtype or torch.float32
            try:
                self.data = torch.full((self.n, vectors.shape[1]), self.fill, dtype=dtype, device=self.device)
            except torch.cuda.OutOfMemoryError:
                print(
                    f"warning: no room on {self.device} for {self.n} x {vectors.shape[1]} embeddings: kept on "
                    f"the host (slower scoring)",
                    file=sys.stderr,
                )
                self.device = torch.device("cpu")
                self.data = torch.full((self.n, vectors.shape[1]), self.fill, dtype=dtype)
        self.data[_index_on(idx, self.device)] = vectors.to(self.device, self.data.dtype)

    def tensor(self):
        import torch

        return self.data if self.data is not None else torch.full((self.n, 1), self.fill, device=self.device)


def _upload_in_groups(items, device, max_ints=1 << 23):
    """(key, [int64 numpy arrays]) items -> (key, [the same arrays as views of device tensors]).
    The arrays of several items travel in one copy of up to max_ints values, which does not
    wait for the device (_to_device): a copy per batch costs a call each, and a copy from
    pageable memory drained the GPU's queue (16 times per model at 40,000 images)."""
    import numpy as np
    import torch

    def copied(group):
        flat = _to_device(torch.from_numpy(np.concatenate([a.ravel() for _, arrays in group for a in arrays])), device)
        offset = 0
        for key, arrays in group:
            views = []
            for a in arrays:
                views.append(flat[offset : offset + a.size].view(a.shape))
                offset += a.size
            yield key, views

    group, size = [], 0
    for key, arrays in items:
        group.append((key, arrays))
        size += sum(a.size for a in arrays)
        if size >= max_ints:
            yield from copied(group)
            group, size = [], 0
    if group:
        yield from copied(group)


def cosines(a, b, ia, ib, chunk=None):
    """float64 array of cos(a[ia[k]], b[ib[k]]) for L2-normalised rows, computed in float32 on
    the device the rows are on (a GPU run's embeddings stay there: 1.5M pairs at 40,000 images
    took ~12 s on the host). chunk: pairs per step; None: 4096 on the CPU (fits its caches:
    2.5-5x faster than 262,144 at 768 dimensions, the same sums), 262,144 on a GPU."""
    import numpy as np
    import torch

    device = a.device if a.device == b.device else torch.device("cpu")  # (a table the device had no room for)
    a, b = a.to(device), b.to(device)
    chunk = chunk or (4096 if device.type == "cpu" else 1 << 18)
    ia = torch.from_numpy(np.asarray(ia, dtype=np.int64)).to(device)
    ib = torch.from_numpy(np.asarray(ib, dtype=np.int64)).to(device)
    out = torch.empty(len(ia), dtype=torch.float64, device=device)
    for s in range(0, len(ia), chunk):
        x = a[ia[s : s + chunk]].float()
        y = b[ib[s : s + chunk]].float()
        out[s : s + chunk] = (x * y).sum(dim=1).double()
    return out.cpu().numpy()


def row_dots(table, vec, chunk=1 << 16):
    """float64 array of table[j] . vec for every row j, in float64 on the table's device: a
    text's dot with the sum of a run's image embeddings (LGIP_SPEC.md section 9: one vector per
    model), exact enough that dividing by N - 1 leaves no float32 rounding of a 40,000-term sum."""
    import torch

    vec = vec.to(table.device, torch.float64)
    out = torch.empty(len(table), dtype=torch.float64, device=table.device)
    for s in range(0, len(table), chunk):
        out[s : s + chunk] = table[s : s + chunk].double() @ vec
    return out.cpu().numpy()
