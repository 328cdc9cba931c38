"""lgip.lookahead: the later models' CPU work (tokenizing, decoding) done in low-priority
worker processes while the current model keeps the GPU busy (accelerations.LOOKAHEAD)."""

import os
import sys
import time

from . import accelerations
from .util import default_num_workers
from .models import known_family
from .tokens import TokenTable, _TextChunks, install_token_table
from .cache import image_cache_keys
from .pixel_memory import pixel_memory, resolve_pixel_memory
from .images import _ImageBatches, _ImageFiles


LOOKAHEAD_STALL_S = (
    120  # a Lookahead job with no batch done for this long is abandoned (its model does the work itself)
)


_AHEAD_ITEMS = []  # in a Lookahead worker process: the job's items (inherited through fork)


def _ahead_worker_start(items):
    """A Lookahead worker: lowest CPU priority (it gets what the current model leaves), one
    thread, Ctrl-C left to the main process (which then stops the job), SIGTERM its default
    (not the main process's handler, inherited through fork): a scheduler's ends it at once."""
    import signal
    import torch

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    torch.set_num_threads(1)
    try:
        os.nice(19)
    except OSError:
        pass
    _AHEAD_ITEMS[:] = [items]


def _ahead_item(n):
    return _AHEAD_ITEMS[0][n]


class Lookahead:
    """The later models' CPU work, done while the current model keeps the GPU busy.

    A run's first model of a tokenization tokenizes every text, and its first model of a pixel
    geometry decodes every image, while the GPU waits (the paper's SigLIP and SigLIP2 models:
    two more tokenizations, two more geometries, ~1.5-2 min of a 40,000-image run). Once a model
    of the run has texts to encode, a helper thread prepares each later model without its
    weights (its family's `prepare`: its tokenizer and pixel geometry) and, one job at a time, in
    worker processes at the lowest CPU priority, tokenizes the run's texts for each tokenization
    no model has had yet and decodes its images for each geometry not yet remembered (into the
    PixelMemory, only where they fit without evicting). `settle(enc)`, called as a model starts,
    waits for a running job it needs, drops one not begun (the model does it itself, at full
    priority), gives up on one with no batch done for LOOKAHEAD_STALL_S, and hands it the
    finished token table. A failed job (a worker killed, a model that cannot be prepared) costs
    only its time: the model does the work itself, and the failure is in its run info.
    >>> ahead = Lookahead(later_specs, "corrected", num_workers=15, pixel_memory_gb="auto")
    >>> ahead.settle(enc); ...; ahead.start(enc, bank.calls, image_paths)   # per model
    >>> ahead.close()                                                        # end of the run
    """

    def __init__(self, specs, protocol, num_workers, pixel_memory_gb="auto", chunk=2048, image_batch=64):
        import threading

        self.specs, self.protocol, self.chunk, self.image_batch = list(specs), protocol, chunk, image_batch
        self.num_workers = default_num_workers() if num_workers is None else num_workers
        self.budget = resolve_pixel_memory(pixel_memory_gb) if accelerations.PIXEL_MEMORY else 0
        self.jobs = []  # {"model", "kind": "tokens"|"pixels"|"prepare", "key", "state", "seconds", "items", "error"}
        self._tables = {}  # tokenizer key -> TokenTable filled ahead
        self._claimed = set()  # (kind, key) a model has started with: not begun ahead any more
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = None

    @property
    def active(self):
        """False when there is nothing to look ahead to, or no worker processes to do it in."""
        return bool(self.specs) and self.num_workers > 0

    def start(self, enc, calls, paths):
        """Begin (once per run) with the texts of `calls` (a TextBank's TextCalls) and
        the image `paths`; `enc`'s own tokenization and geometry are not repeated."""
        import threading

        if self._thread is not None or not self.active:
            return
        self._thread = threading.Thread(target=self._work, args=(self._needs(enc), calls, list(paths)), daemon=True)
        self._thread.start()

    @staticmethod
    def _needs(enc):
        """The (kind, key) jobs whose work a model (an Encoder or a Prepared) can use."""
        return {("tokens", enc.tokenizer_key), ("pixels", enc.pixels.key if enc.pixels is not None else None)}

    def settle(self, enc):
        """Before a model encodes: wait for the jobs it can use; (seconds waited, their records)."""
        wanted = self._needs(enc)
        t0 = time.perf_counter()
        with self._cond:
            self._claimed |= wanted
            while True:
                running = [j for j in self.jobs if j["state"] == "running" and (j["kind"], j["key"]) in wanted]
                if not running:
                    break
                for j in running:  # no batch for a while (a stuck worker): the model does the work itself
                    if time.perf_counter() - j["progress_at"] > LOOKAHEAD_STALL_S:
                        j["state"] = "abandoned"
                if any(j["state"] == "running" for j in running):
                    self._cond.wait(0.5)
            mine = [
                j
                for j in self.jobs
                if (j["kind"], j["key"]) in wanted or (j["kind"] == "prepare" and j["model"] == enc.name)
            ]
            table = self._tables.pop(enc.tokenizer_key, None)
        if table is not None:
            install_token_table(enc.tokenizer_key, table)
        report = [
            {k: j[k] for k in ("kind", "model", "state", "seconds", "items", "error") if j.get(k) is not None}
            for j in mine
        ]
        return round(time.perf_counter() - t0, 3), report

    def close(self):
        """Stop (the run ends or failed): the helper thread ends, its worker processes with it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _work(self, done, calls, paths):
        texts = None
        for spec in self.specs:
            if self._stop.is_set():
                return
            kind = known_family(spec)
            preparer = kind.prepare if kind is not None else None
            if preparer is None:  # (a loader of one's own: nothing can be had without running it)
                continue
            try:
                prep = preparer(spec, self.protocol)
            except Exception as e:  # the model's own load reports it properly
                self._record(
                    {
                        "model": spec.get("name"),
                        "kind": "prepare",
                        "key": None,
                        "state": "failed",
                        "error": f"{type(e).__name__}: {e}",
                    }
                )
                continue
            for kind, key in sorted(self._needs(prep), key=lambda job: job[0] != "tokens"):  # tokens first
                if self._stop.is_set():
                    return
                if (
                    key is None
                    or (kind, key) in done
                    or (kind == "pixels" and self.budget <= 0)
                    or (kind == "tokens" and not accelerations.SHARED_TOKENS)
                ):  # (a table no model would take)
                    continue
                done.add((kind, key))
                if kind == "tokens" and texts is None:
                    texts = list(dict.fromkeys(calls.texts))
                self._job(prep, kind, key, texts if kind == "tokens" else paths)

    def _record(self, job):
        with self._cond:
            self.jobs.append(job)
            self._cond.notify_all()

    def _job(self, prep, kind, key, items):
        job = {
            "model": prep.name,
            "kind": kind,
            "key": key,
            "state": "running",
            "progress_at": time.perf_counter(),
            "t0": time.perf_counter(),
        }
        with self._cond:
            if (kind, key) in self._claimed:
                job["state"] = "dropped"  # its model started first: it does the work itself
            self.jobs.append(job)
        if job["state"] == "dropped":
            return
        t0 = time.perf_counter()
        error = None
        try:
            n = self._tokenize(prep, items, job) if kind == "tokens" else self._decode(prep, items, job)
        except Exception as e:
            n, error = None, f"{type(e).__name__}: {e}"
            print(
                f"warning: looking ahead for {prep.name} ({kind}) failed, it does that itself: {error}", file=sys.stderr
            )
        with self._cond:
            if job["state"] == "running":  # (not abandoned by settle meanwhile)
                job["state"] = "failed" if error else "done" if n is not None else "stopped"
            if job["state"] == "done" and kind == "tokens":
                self._tables[key] = n[1]
            job.update(
                seconds=round(time.perf_counter() - t0, 3),
                items=n[0] if kind == "tokens" and n else n,
                error=error,
                t1=time.perf_counter(),
            )
            self._cond.notify_all()

    def _batches(self, dataset, job):
        """Each item of `dataset` (a sequence), in order, computed by this job's worker processes
        (at most two per worker in flight). Not a DataLoader: torch watches its workers from the
        main thread, where a look-ahead worker's death would raise; here it fails the job only.
        Stops early (returns) when the run stops or settle abandons the job."""
        import collections
        import concurrent.futures as cf
        import multiprocessing

        pool = cf.ProcessPoolExecutor(
            self.num_workers,
            mp_context=multiprocessing.get_context("fork"),
            initializer=_ahead_worker_start,
            initargs=(dataset,),
        )
        pending, sent, finished = collections.deque(), 0, False
        try:
            while sent < len(dataset) or pending:
                while sent < len(dataset) and len(pending) < 2 * self.num_workers:
                    pending.append(pool.submit(_ahead_item, sent))
                    sent += 1
                try:
                    item = pending[0].result(timeout=0.5)
                except cf.TimeoutError:
                    if self._stop.is_set() or job["state"] != "running":
                        return
                    continue
                pending.popleft()
                job["progress_at"] = time.perf_counter()
                yield item
                if self._stop.is_set() or job["state"] != "running":
                    return
            finished = True
        finally:
            procs = list((getattr(pool, "_processes", None) or {}).values())  # (shutdown forgets them)
            pool.shutdown(wait=finished, cancel_futures=True)
            if not finished:  # a worker may be stuck: do not leave it behind
                for p in procs:
                    p.terminate()
                for p in procs:
                    p.join(timeout=5)

    def _tokenize(self, prep, texts, job):
        """(texts tokenized, their TokenTable), or None when stopped early."""
        table = TokenTable()
        chunks = _TextChunks(texts, prep.tokenize, self.chunk)
        for n, (flat, lengths) in enumerate(self._batches(chunks, job), 1):
            table.add(texts[(n - 1) * self.chunk : n * self.chunk], flat, lengths)
        return (len(table), table) if len(table) == len(texts) else None

    def _decode(self, prep, paths, job):
        """Images decoded and remembered (None when stopped early)."""
        memory = pixel_memory(self.budget)
        key = prep.pixels.key
        with memory.lock:
            known = set(memory.geometries[key]["where"]) if key in memory.geometries else set()
        paths = list(dict.fromkeys(paths))
        todo = [(paths[i], k) for i, k in image_cache_keys(paths).items() if k not in known]
        batches = _ImageBatches(_ImageFiles([p for p, _ in todo], prep.pixels.geometry), self.image_batch)
        n = done = 0
        for b, (idx, batch, _bad) in enumerate(
            self._batches(batches, job), 1
        ):  # unreadable: their model retries and reports
            memory.add(key, [todo[j][1] for j in idx], batch, evict=False)  # idx: indices into todo
            n, done = n + len(idx), b
        return n if done == len(batches) else None
