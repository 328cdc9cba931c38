"""lgip.cache: the on-disk cache of what a model computed, per model, protocol and dtype, one interface for
every scorer (`lookup(kind, keys)`, `writer(kind)`, `holds(entries)`, `through(kind, keys, compute)`; `NoCache`
the same with nothing in it; lgip.scorers.cached wraps any scorer with it): image embeddings keyed by path,
size and mtime, text embeddings by text and padding, and (for a model that scores a pair jointly,
LGIP_SPEC.md 13) a score per (image, text) pair keyed by both (`pair_cache_key`: its own chunks,
`pair-*.npz`, beside the others'); chunks written whole by a thread of their own,
a corrupt one reported and rebuilt. A cache that cannot be written (a full disk, a quota, a
read-only folder) never costs the run: said once, the run goes on without caching the rest, and
what is on disk stays usable.

    >>> cache = ModelCache(".lgip_cache", enc, spec); pos, emb = cache.lookup("text", keys)
"""

import json
import os
import re
import sys
import threading
import time
from contextlib import contextmanager

from . import accelerations
from .errors import CacheError, OutputError
from .memory import KEPT
from .models.families import known_family
from .util import package_versions
from .outputs import atomic_open, write_json

_SAYING = threading.Lock()  # (the text and image writers' threads may fail at once)


def image_cache_key(path):
    """Path, size and mtime: an edited or replaced image is never served from the cache. An
    altered image (lgip.alterations.AlteredImage): its source's key, kind and SEED (a flip's: and
    the other image's key and r), never an original's key. Any other image that is not a file path
    (lgip.classification.datasets' items) makes its own key (`cache_key(key_of)`)."""
    if not isinstance(path, (str, os.PathLike)):
        return path.cache_key(image_cache_key)
    st = os.stat(path)
    return f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}"


def image_cache_keys(paths):
    """{index: image_cache_key} of the paths that exist (a missing file: its loader reports it)."""
    keys = {}
    for i, p in enumerate(paths):
        try:
            keys[i] = image_cache_key(p)
        except OSError:
            pass
    return keys


def pair_cache_key(image_key, text_key):
    """A pair entry's key: its image's key (image_cache_key) and its text's (the bank's), joined by a
    separator that neither holds (a path joins size and mtime with "|"; JSON escapes control characters)."""
    return f"{image_key}\x1f{text_key}"


KINDS = ("image", "text", "pair")  # the entries a cache holds; each kind's chunks are `<kind>-*.npz`


class ModelCache:
    """Embeddings and pair scores already computed, on disk, per model, protocol and dtype.

    Layout: <CACHE_DIR>/<model>-<hash>/ with meta.json and chunk files `image-*.npz`, `text-*.npz` and
    `pair-*.npz` (arrays `emb` and `keys`, the keys as UTF-8 JSON; a pair's row is its one score). The hash
    covers the model spec (and a local checkpoint's size and mtime), the protocol, the dtype and the open_clip,
    transformers and torch versions, so a changed setting never reuses stale entries. Chunks
    are written whole (temp file, then rename) every few thousand items, so an interrupted run
    resumes from its last chunk; a chunk that fails to load (truncated, corrupt) is reported,
    deleted, and its items re-encoded.
    """

    def __init__(self, root, enc, spec, chunk_rows=8192, flush_s=60.0):
        import hashlib

        ident = {
            "spec": {k: v for k, v in spec.items() if k != "name"},
            "protocol": enc.protocol,
            "dtype": str(enc.dtype),
            "versions": package_versions(("open_clip_torch", "transformers", "torch")),
        }
        for key in ("pretrained", "model_id", "model_name"):
            path = str(spec.get(key, "")).replace("local-dir:", "")
            if path and os.path.exists(path):
                ident[f"{key}_stat"] = _tree_stat(path)
        # what the model's scores depend on beyond its weights (a joint model's score, prompt and question, their
        # defaults filled: a default given or left out is one setting); a dual encoder has none
        settings = getattr(enc, "settings", None)
        if settings is not None:
            ident["settings"] = settings = dict(settings)
            ident["spec"] = {k: v for k, v in ident["spec"].items() if k not in settings}
        kind = known_family(spec)
        files = kind.cache_files if kind is not None else None  # (a loader of one's own: its code, its kwargs' files)
        if files is not None:
            ident["loader_stat"] = [_tree_stat(f) for f in files(spec) if f and os.path.exists(f)]
        # what computed the entries: lgip's own code for the family (a fix to how it encodes is never served stale)
        # and the switches on now that are not bit-exact at this dtype (a run with one off never reads their entries)
        if kind is not None:
            ident["code_version"] = {kind.type: kind.code_version}
            ident["accelerations"] = accelerations.inexact(kind.accelerations, enc.dtype)
        digest = hashlib.sha1(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", spec.get("name", "model"))[:80]
        self.root, self.dir = os.path.abspath(root), os.path.join(root, f"{slug}-{digest}")
        if kind is not None and not os.path.isdir(self.dir):
            _older_folders(root, slug, ident)
        self.chunk_rows = chunk_rows
        self.flush_s = (
            flush_s  # a chunk is also written once its oldest row is this old: a crash loses at most that much work
        )
        self.fp16 = enc.rounds_to_fp16  # then stored rows are fp16 values
        self._index = {}
        # write_error: why this run stopped writing the cache (None: it did not)
        self.stats = {
            "image_hits": 0,
            "text_hits": 0,
            "corrupt_chunks": 0,
            "write_error": KEPT.unwritable.get(self.root),
        }
        if self.writable:
            meta = os.path.join(self.dir, "meta.json")
            try:
                os.makedirs(self.dir, exist_ok=True)
                if not os.path.exists(meta):
                    write_json(meta, ident, output=False)
            except (OSError, OutputError) as e:
                self.cannot_write(e, meta)

    @property
    def writable(self):
        return self.stats["write_error"] is None

    def cannot_write(self, e, path):
        """A cache file could not be written (e: OSError or OutputError): the run goes on without
        writing more (said once per process and cache folder); what is on disk stays usable."""
        why = e.reason if isinstance(e, OutputError) else (e.strerror or str(e))
        with _SAYING:
            self.stats["write_error"] = why
            if self.root in KEPT.unwritable:
                return
            KEPT.unwritable[self.root] = why  # (said once: this process writes there no more)
        print(
            f"warning: the embedding cache cannot be written ({path}: {why}); the run goes on without caching "
            f"the rest: its results are the same, what is cached stays usable, and a re-run encodes again what "
            f"was not cached. Free space there (or get write permission), or pass --CACHE_DIR=<a writable folder "
            f"with room> (None: no cache).",
            file=sys.stderr,
            flush=True,
        )

    def _load(self, kind):
        import numpy as np

        if kind in self._index:
            return self._index[kind]
        index, arrays = {}, []
        for name in sorted(os.listdir(self.dir) if os.path.isdir(self.dir) else []):
            path = os.path.join(self.dir, name)
            if name.startswith("." + kind + "-") and name.endswith(".tmp"):
                # Left by an interrupted write; a young one may be another process's write in progress.
                try:
                    if time.time() - os.path.getmtime(path) > 3600:
                        os.unlink(path)
                except OSError:  # (gone already; a read-only cache)
                    pass
                continue
            if not (name.startswith(kind + "-") and name.endswith(".npz")):
                continue
            try:
                with np.load(path, allow_pickle=False) as z:
                    emb, keys = z["emb"], json.loads(bytes(z["keys"]).decode("utf-8"))
                if emb.ndim != 2 or len(keys) != emb.shape[0]:
                    raise CacheError(f"{len(keys)} keys for {emb.shape} embeddings")
            except Exception as e:  # any unreadable chunk is rebuilt, never trusted
                print(
                    f"warning: cache chunk {path} is corrupt ({type(e).__name__}: {e}); "
                    f"deleted, its entries will be encoded again",
                    file=sys.stderr,
                )
                self.stats["corrupt_chunks"] += 1
                try:
                    os.unlink(path)
                except OSError:  # (a read-only cache: skipped all the same)
                    pass
                continue
            c = len(arrays)
            arrays.append(emb)
            for r, k in enumerate(keys):
                index[k] = (c, r)
        self._index[kind] = (index, arrays)
        return self._index[kind]

    def index(self, kind):
        """{key: where} of every entry of one kind (KINDS: "image", "text", "pair") on disk."""
        return self._load(kind)[0]

    def has_entries(self, kind=None):
        """True when a chunk of this kind (None: of any kind) is on disk (a re-run; nothing is read)."""
        kinds = KINDS if kind is None else (kind,)
        return os.path.isdir(self.dir) and any(
            n.startswith(k + "-") and n.endswith(".npz") for n in os.listdir(self.dir) for k in kinds
        )

    def lookup(self, kind, keys):
        """(positions of keys found, their rows as a float32 tensor: embeddings, or a pair's scores)."""
        import numpy as np
        import torch

        index, arrays = self._load(kind)
        pos = [p for p, k in enumerate(keys) if k in index]
        if not pos:
            return [], None
        rows = np.stack([arrays[index[keys[p]][0]][index[keys[p]][1]] for p in pos])
        # (a pair entry's hits are counted only where pairs are looked up: the run blocks of today's
        # dual encoders keep their keys)
        self.stats[kind + "_hits"] = self.stats.get(kind + "_hits", 0) + len(pos)
        return pos, torch.from_numpy(rows.astype(np.float32))

    def writer(self, kind):
        return _ChunkWriter(self, kind)

    def holds(self, entries):
        """True when every key of `entries` ({kind: [key, ...]}) is on disk (nothing is read but the index)."""
        return all(key in self.index(kind) for kind, keys in entries.items() for key in keys)

    def through(self, kind, keys, compute):
        """lm-eval's CachingLM for one keyed computation: the row of each key (a list of floats), the cache's
        where it holds it, else from `compute(positions)` -> [row per position], asked for the rest alone (its
        rows kept as it gives them, added to the cache in float32, one chunk written at the end)."""
        import torch

        pos, rows = self.lookup(kind, keys)
        out = [None] * len(keys)
        for p, row in zip(pos, rows.tolist() if rows is not None else []):
            out[p] = row
        todo = [p for p, row in enumerate(out) if row is None]
        if todo:
            new = compute(todo)
            writer = self.writer(kind)
            writer.add([keys[p] for p in todo], torch.tensor(new, dtype=torch.float32).reshape(len(todo), -1))
            writer.close()
            for p, row in zip(todo, new):
                out[p] = row
        return out


_OLDER_SAID = set()  # the folders of an older lgip this process has named


def _older_folders(root, slug, ident):
    """Name, once per process, a folder of this model in `root` written by an lgip older than code versions (its
    meta.json has no `code_version`, and is otherwise this identity): its entries are not used, since nothing says
    which code computed them."""
    mine = {k: v for k, v in ident.items() if k not in ("code_version", "accelerations", "versions")}
    try:
        names = sorted(n for n in os.listdir(root) if n.startswith(slug + "-"))
    except OSError:
        return
    for name in names:
        folder = os.path.join(root, name)
        try:
            with open(os.path.join(folder, "meta.json"), encoding="utf-8") as f:
                meta = json.load(f)
        except (OSError, ValueError):
            continue
        if not isinstance(meta, dict) or "code_version" in meta or folder in _OLDER_SAID:
            continue
        if {k: v for k, v in meta.items() if k != "versions"} == json.loads(json.dumps(mine, default=str)):
            _OLDER_SAID.add(folder)
            print(
                f"note: the cache folder {folder} was written by an older lgip (its meta.json has no code_version): "
                f"not used, since nothing says which code computed its entries; this run encodes them again in a "
                f"new folder beside it (delete the old one to free its space)",
                file=sys.stderr,
                flush=True,
            )


class NoCache:
    """No cache (CACHE_DIR None, a model in memory): what a scorer is handed instead of a ModelCache, with its
    interface: nothing held, nothing written. False as a truth value, so the code beneath a scorer (lgip.texts,
    lgip.images) skips the work of looking up (stat-ing files, making keys)."""

    dir = None

    def __bool__(self):
        return False

    def lookup(self, kind, keys):
        return [], None

    def index(self, kind):
        return {}

    def has_entries(self, kind=None):
        return False

    def writer(self, kind):
        return None

    def holds(self, entries):
        return not any(entries.values())

    def through(self, kind, keys, compute):
        return list(compute(list(range(len(keys))))) if keys else []


class PairScores:
    """A model's scores by (image, text): those known (looked up in the cache, or added), the cache's "pair"
    entries keyed by the image's key (image_cache_key: an altered image's too) and the text; what is added is
    written to the cache in whole chunks (`writing`). A scorer that scores pairs one image at a time keeps its
    scores here (lgip.scorers.joint); `flush` is where a subclass hands over what it still computes."""

    def __init__(self, cache):
        self.cache, self.scores, self.image_keys, self.n_added, self.n_hits = cache, {}, {}, 0, 0
        self.writer = cache.writer("pair") if cache else None

    @contextmanager
    def writing(self):
        """The block that computes scores: at its end (after `flush`) the cache's last chunk is written; should
        it fail (or be interrupted), the whole chunks handed over are kept and the rest dropped."""
        try:
            yield self
            self.flush()
        except BaseException:
            if self.writer is not None:
                self.writer.abandon()
            raise
        if self.writer is not None:
            self.writer.close()

    def flush(self):
        """Scores still being computed, added (none here)."""

    def image_key(self, path):
        """The image's cache key, or None when its file cannot be stat'ed (missing: unreadable)."""
        if path not in self.image_keys:
            try:
                self.image_keys[path] = image_cache_key(path)
            except OSError:
                self.image_keys[path] = None
        return self.image_keys[path]

    def _keys(self, path, texts):
        return [pair_cache_key(self.image_key(path), json.dumps(t, ensure_ascii=False)) for t in texts]

    def missing(self, path, texts):
        """The texts of `texts` whose score with `path` is known neither here nor in the cache (looked up)."""
        todo = [t for t in dict.fromkeys(texts) if (path, t) not in self.scores]
        if todo and self.cache and self.image_key(path) is not None:
            pos, rows = self.cache.lookup("pair", self._keys(path, todo))
            for p, r in zip(pos, rows[:, 0].tolist() if rows is not None else []):
                self.scores[(path, todo[p])] = r
            self.n_hits += len(pos)
            found = set(pos)
            todo = [t for j, t in enumerate(todo) if j not in found]
        return todo

    def add(self, path, texts, values, since=None):
        """The scores of `texts` with `path`, computed (since: time.monotonic() when their work began)."""
        import torch

        for t, v in zip(texts, values):
            self.scores[(path, t)] = float(v)
        self.n_added += len(texts)
        if self.writer is not None and self.image_key(path) is not None:
            self.writer.add(self._keys(path, texts), torch.tensor(values, dtype=torch.float32)[:, None], since=since)


def _tree_stat(path):
    """Sizes and mtimes of a checkpoint file or folder (to notice replaced weights)."""
    if os.path.isfile(path):
        st = os.stat(path)
        return [st.st_size, st.st_mtime_ns]
    out = []
    for name in sorted(os.listdir(path)):
        st = os.stat(os.path.join(path, name))
        out.append([name, st.st_size, st.st_mtime_ns])
    return out


class _ChunkWriter:
    """Adds embeddings to a cache in chunk files, written by a thread of its own: the copy to the
    host and the file write overlap the device's work instead of holding up the loop that feeds
    it (~2.6 GB of fp16 text rows per model at 40,000 images). At most `ahead` chunks wait to
    be written. A chunk that cannot be written (no space, no permission) is dropped, and so is
    every later one (ModelCache.cannot_write); any other failure is raised by the next add
    or by close."""

    def __init__(self, cache, kind, ahead=2):
        self.cache, self.kind, self.ahead, self.parts, self.n = cache, kind, ahead, [], 0
        self._pool, self._pending = None, []

    def add(self, keys, emb, since=None):
        """Add rows; `since`: when the work that made them began (time.monotonic()), for the
        time bound: a chunk is written once its oldest rows' work began flush_s ago."""
        if not self.parts:
            self.since = time.monotonic() if since is None else since
        self.parts.append((keys, emb))  # (one step: an interrupt never leaves keys without their rows)
        self.n += len(keys)
        if self.n >= self.cache.chunk_rows or self.due():
            self.flush()

    def due(self, since=None):
        """True when rows begun at `since` (default: the oldest held here) are flush_s old."""
        since = since if since is not None else (self.since if self.parts else None)
        return since is not None and time.monotonic() - since >= self.cache.flush_s

    def flush(self):
        import concurrent.futures as cf
        import torch

        parts, self.parts, self.n = self.parts, [], 0
        if not parts or not self.cache.writable:
            return
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(1, thread_name_prefix="lgip-cache-writer")
        keys = [k for ks, _ in parts for k in ks]
        self._pending.append(self._pool.submit(self._write, keys, torch.cat([e for _, e in parts])))
        while len(self._pending) > self.ahead:
            self._pending.pop(0).result()

    def _write(self, keys, emb):
        import uuid
        import numpy as np
        import torch

        if not self.cache.writable:
            return
        if self.cache.fp16 and self.kind != "pair":  # (a pair's score is kept as it was computed)
            emb = emb.to(torch.float16)  # lossless: its values were rounded to fp16 already (storage_dtype)
        emb = emb.cpu().numpy()
        keys = np.frombuffer(json.dumps(keys, ensure_ascii=False).encode("utf-8"), dtype=np.uint8)
        path = os.path.join(self.cache.dir, f"{self.kind}-{uuid.uuid4().hex}.npz")
        try:
            # (np.load checks the zip's CRCs: a chunk lost to a power cut is rebuilt)
            with atomic_open(path, "wb", durable=False, output=False) as f:
                np.savez(f, emb=emb, keys=keys)
        except (OSError, OutputError) as e:  # no partial chunk is left: the cache stays whole
            self.cache.cannot_write(e, path)

    def close(self):
        """Write what is left and wait for every chunk (raises the first failed write)."""
        try:
            self.flush()
            while self._pending:
                self._pending.pop(0).result()
        finally:
            self.abandon()

    def abandon(self):
        """The run failed or was interrupted: the whole chunks handed over are written (a re-run
        resumes from them), the rows of the unfinished one are dropped."""
        self.parts, self.n = [], 0
        for future in self._pending:
            try:
                future.result()
            except Exception as e:  # the run's own error is the one to see; this one is reported
                print(f"warning: a cache chunk could not be written ({type(e).__name__}: {e})", file=sys.stderr)
        self._pending = []
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
