"""lgip.images: image files decoded in DataLoader workers and encoded beside the texts'
batches (`ImageEncoding`: start, poll between text batches, finish); the images of records
(`RecordImages`), unreadable files reported and skipped, never fatal.

    >>> job = ImageEncoding(enc, paths, cache=cache).start()
    >>> for batch in text_batches: encode(batch); job.poll()
    >>> emb, failed = job.finish()
"""

import os
import sys

from . import accelerations
from .util import default_num_workers, progress_bar
from .device import _DeviceRows, _Rows
from .cache import image_cache_keys
from .pixel_memory import PixelMemory, pixel_memory, resolve_pixel_memory


MIN_SIDE = 8  # px: a smaller image is unreadable (a preprocessor takes a side of 1 or 3 px for the channels)


def open_rgb(path):
    """Decode an image fully and convert it to RGB (grayscale, CMYK, palette, alpha); OSError for
    one under MIN_SIDE px a side (transformers' processors read a 50x1 image's side as its channels
    and stop a batch, a 100x3 one's and give a wrong embedding)."""
    from PIL import Image

    with Image.open(path) as img:
        return rgb_of(img)


def rgb_of(img):
    """A PIL image decoded fully and converted to RGB, as open_rgb does a file's (OSError under MIN_SIDE px a
    side): an image that is not a file (a dataset's item, a webdataset member) is read as a file's is."""
    if min(img.size) < MIN_SIDE:
        raise OSError(f"image too small ({img.size[0]}x{img.size[1]} px; at least {MIN_SIDE} px a side)")
    img.load()  # truncated files fail here, not later in a worker's transform
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    return img.convert("RGB")


def _open_file(path):
    if os.path.getsize(path) == 0:
        raise OSError("empty file")
    return open_rgb(path)


class _ImageFiles:
    """Dataset of (index, transformed image or None, error or None); bad files never raise. An
    item is an image file's path, or an image made here by its own `make(open_file)`: an AlteredImage
    (lgip.alterations), made from its decoded source (and other image), the few files decoded last kept,
    so the kinds of one record, listed together, decode its files once in a worker; an image that is
    no file of its own (lgip.classification.datasets: a dataset's item, a webdataset's member)."""

    RECENT = 4  # decoded files kept (an altered image's source and other image)

    def __init__(self, paths, transform):
        self.paths, self.transform = paths, transform
        self._recent = {}

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        try:
            item = self.paths[i]
            img = _open_file(item) if isinstance(item, (str, os.PathLike)) else item.make(self._open_recent)
            return i, self.transform(img), None
        except Exception as e:  # any unreadable image is reported, never fatal
            return i, None, f"{type(e).__name__}: {e}"

    def _open_recent(self, path):
        img = self._recent.pop(path, None)
        img = _open_file(path) if img is None else img  # (the alterations never change their input)
        self._recent[path] = img
        while len(self._recent) > self.RECENT:
            self._recent.pop(next(iter(self._recent)))
        return img


def _collate_images(items):
    import torch

    good = [(i, x) for i, x, err in items if err is None]
    bad = [(i, err) for i, x, err in items if err is not None]
    if not good:
        return [], None, bad
    xs = [x for _, x in good]
    if isinstance(xs[0], dict):
        batch = {k: torch.stack([x[k] for x in xs]) for k in xs[0]}
    else:
        batch = torch.stack(xs)
    return [i for i, _ in good], batch, bad


class ImageEncoding:
    """Encoding of image files that runs beside other GPU work (the texts' encoding).

    `start()` opens the decoding worker processes, `poll()` encodes the batches they have
    ready without waiting, `finish()` encodes the rest and returns ([len(paths), D] float32,
    NaN rows for failures; {index: error}). CPU decoding thus overlaps the GPU's text batches,
    while every GPU call stays in the calling thread (a helper thread only hands the decoded
    batches over, and starts after all worker processes are forked). With an ModelCache,
    images already encoded by this model (same path, size and mtime) are read from it, and
    new ones are saved to it as they are encoded.
    >>> job = ImageEncoding(enc, paths, cache=cache).start()
    >>> for batch in text_batches: encode(batch); job.poll()
    >>> emb, failed = job.finish()
    """

    _END = object()

    def __init__(self, enc, paths, batch_size=64, num_workers=None, desc="images", cache=None, pixel_memory_gb="auto"):
        self.enc, self.paths, self.batch_size, self.desc, self.cache = enc, paths, batch_size, desc, cache
        self.num_workers = default_num_workers() if num_workers is None else num_workers
        self.out, self.failed, self.keys = _Rows(len(paths), float("nan"), enc.device, enc.storage_dtype), {}, {}
        self.todo = list(range(len(paths)))
        self._queue = self._thread = self._bar = None  # (close() after a start() that failed part way)
        budget = resolve_pixel_memory(pixel_memory_gb)
        remember = enc.pixels is not None and budget > 0 and accelerations.PIXEL_MEMORY
        self.memory = pixel_memory(budget) if remember else None
        if cache or self.memory is not None:  # (cache: a ModelCache; None or NoCache: nothing to look up)
            self.keys = image_cache_keys(paths)
        if cache:
            have = [i for i in self.todo if i in self.keys]
            hit_pos, hit_emb = cache.lookup("image", [self.keys[i] for i in have])
            if hit_pos:
                self.out.put([have[p] for p in hit_pos], hit_emb)
            done = {have[p] for p in hit_pos}
            self.todo = [i for i in self.todo if i not in done]
        # Pixels decoded for an earlier model of this process with the same geometry: not decoded again.
        self.n_cached = len(paths) - len(self.todo)
        self._known = self.memory.get(enc.pixels.key) if self.memory is not None else None
        self.remembered = [i for i in self.todo if self._known is not None and self.keys.get(i) in self._known["where"]]
        if self.remembered:
            taken = set(self.remembered)
            self.todo = [i for i in self.todo if i not in taken]
        self.n_decoded, self.n_remembered = len(self.todo), len(self.remembered)

    def start(self):
        import queue
        import threading
        import torch

        if self._queue is not None or not (self.todo or self.remembered):
            return self
        self._writer = self.cache.writer("image") if self.cache else None
        self._rows = _DeviceRows(self.enc, self.out, self._writer, self.keys.__getitem__)
        self._queue = queue.Queue(maxsize=4)  # bounded: decoded batches wait in the workers, not here
        self._ended, self._closed = False, threading.Event()
        # A worker decodes a whole batch: a small job gets smaller batches so every worker has one.
        per_worker = -(-len(self.todo) // max(1, self.num_workers))
        decode_batch = max(1, min(self.batch_size, per_worker))
        self._bar = progress_bar(
            -(-len(self.todo) // decode_batch) + -(-len(self.remembered) // self.batch_size),
            desc=f"{self.enc.name}: {self.desc}",
            unit="batch",
            min_total=20,
        )
        if not self.todo:
            self._ended = True
            return self
        transform = self.enc.pixels.geometry if self.enc.pixels is not None else self.enc.image_transform
        loader = torch.utils.data.DataLoader(
            _ImageFiles([self.paths[i] for i in self.todo], transform),
            batch_size=decode_batch,
            shuffle=False,
            num_workers=self.num_workers,
            collate_fn=_collate_images,
            pin_memory=str(self.enc.device).startswith("cuda"),
            persistent_workers=False,
        )
        batches = iter(loader)  # forks the workers, before the helper thread exists
        self._thread = threading.Thread(target=self._hand_over, args=(batches,), daemon=True)
        self._thread.start()
        return self

    def _hand_over(self, batches):
        try:
            for item in batches:
                if not self._put(item):
                    return  # closed: the loader's workers shut down with its iterator
        except BaseException as e:  # re-raised in the calling thread
            self._put(e)
        self._put(self._END)

    def _put(self, item):
        import queue

        while not self._closed.is_set():
            try:
                self._queue.put(item, timeout=0.2)
                return True
            except queue.Full:
                pass
        return False

    def close(self, keep=False):
        """Stop early (the caller failed, or keep: was interrupted by Ctrl-C or SIGTERM): the cache
        chunks already whole are written (keep: and every image encoded so far), then the helper
        thread ends and the decoding workers with it."""
        if self._queue is None:
            return
        self._rows.stop(keep)
        if not self._ended and self._thread is not None:
            self._closed.set()
            self._thread.join(timeout=30)
        if self._bar is not None:
            self._bar.close()

    def _take(self, item):
        if item is self._END:
            self._ended = True
            return
        if isinstance(item, BaseException):
            raise item
        idx, batch, bad = item
        self.failed.update((self.todo[j], err) for j, err in bad)
        if self.memory is not None:
            self.memory.add(self.enc.pixels.key, [self.keys.get(self.todo[j]) for j in idx], batch)
        if idx:
            self._rows.add([self.todo[j] for j in idx], self._encode(batch))
        self._bar.update(1)

    def _encode(self, batch):
        """Embeddings of one batch: a uint8 one (enc.pixels.geometry's) gets its arithmetic on the device first."""
        import torch

        if torch.is_tensor(batch) and batch.dtype == torch.uint8:
            batch = self.enc.pixels.to_input(batch, self.enc.device, self.enc.dtype)
        return self.enc.encode_images(batch)

    def _recall(self):
        """Encode one batch of remembered pixels (False when none is left)."""
        if not self.remembered:
            return False
        take, self.remembered = self.remembered[: self.batch_size], self.remembered[self.batch_size :]
        pinned = str(self.enc.device).startswith("cuda")
        self._rows.add(take, self._encode(PixelMemory.batch(self._known, [self.keys[i] for i in take], pinned)))
        self._bar.update(1)
        return True

    def poll(self):
        """Encode the batches already decoded, and one remembered batch; never waits."""
        import queue

        if self._queue is None:
            return
        self._recall()
        while not self._ended:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            self._take(item)

    def finish(self):
        self.start()
        if self._queue is not None:
            try:
                while self._recall():
                    pass
                while not self._ended:
                    self._take(self._queue.get())
                self._rows.flush()
            except BaseException as e:
                self.close(keep=isinstance(e, KeyboardInterrupt))
                raise
            self._bar.close()
            if self._writer is not None:
                self._writer.close()
        return self.out.tensor(), self.failed


def embed_images(enc, paths, batch_size=64, num_workers=None, desc="images", cache=None, pixel_memory_gb="auto"):
    """Encode image files: ([len(paths), D] float32 with NaN rows for failures, {index: error})."""
    return ImageEncoding(enc, paths, batch_size, num_workers, desc, cache, pixel_memory_gb).start().finish()


class RecordImages(ImageEncoding):
    """The images of records[indices], each file once; `finish()` returns ([len(records), D]
    embeddings, NaN where not encoded; the usable indices; a failure report
    {num_failed_images, failed_images: [{path, error}] (first few)}).
    """

    def __init__(
        self,
        enc,
        records,
        image_root,
        batch_size,
        num_workers,
        indices=None,
        cache=None,
        max_listed=20,
        pixel_memory_gb="auto",
    ):
        self.n_records, self.max_listed = len(records), max_listed
        self.indices = range(len(records)) if indices is None else indices
        self.path_of = {k: os.path.join(image_root, records[k][1]["image_path"]) for k in self.indices}
        super().__init__(
            enc,
            list(dict.fromkeys(self.path_of.values())),
            batch_size,
            num_workers,
            cache=cache,
            pixel_memory_gb=pixel_memory_gb,
        )

    def finish(self):
        import numpy as np
        import torch

        emb, failed = super().finish()
        where = {p: j for j, p in enumerate(self.paths)}
        full = torch.full((self.n_records, emb.shape[1]), float("nan"), dtype=emb.dtype, device=emb.device)
        if self.path_of:
            ks = list(self.path_of)
            full[torch.as_tensor(ks, device=emb.device)] = emb[
                torch.as_tensor(np.array([where[self.path_of[k]] for k in ks]), device=emb.device)
            ]
        bad_paths = {self.paths[j]: err for j, err in failed.items()}
        for p, err in list(bad_paths.items())[: self.max_listed]:
            print(f"warning: {self.enc.name}: skipping unreadable image {p} ({err})", file=sys.stderr)
        if len(bad_paths) > self.max_listed:
            print(
                f"warning: {self.enc.name}: ... and {len(bad_paths) - self.max_listed} more unreadable images",
                file=sys.stderr,
            )
        ok = [k for k in self.indices if self.path_of[k] not in bad_paths]
        report = {
            "num_failed_images": len(bad_paths),
            "failed_images": [{"path": p, "error": e} for p, e in list(bad_paths.items())[: self.max_listed]],
        }
        return full, ok, report


def encode_record_images(
    enc, records, image_root, batch_size, num_workers, indices=None, cache=None, max_listed=20, pixel_memory_gb="auto"
):
    """RecordImages(...) run to the end: (embeddings, usable indices, failure report)."""
    return (
        RecordImages(enc, records, image_root, batch_size, num_workers, indices, cache, max_listed, pixel_memory_gb)
        .start()
        .finish()
    )


class _ImageBatches:
    """An _ImageFiles in batches, each as _collate_images makes it (a DataLoader's batches, as a sequence)."""

    def __init__(self, files, batch):
        self.files, self.batch = files, batch

    def __len__(self):
        return -(-len(self.files) // self.batch)

    def __getitem__(self, n):
        return _collate_images(
            [self.files[i] for i in range(n * self.batch, min((n + 1) * self.batch, len(self.files)))]
        )
