"""lgip.pixel_memory: decoded uint8 pixels kept in host memory for the run's later models
of the same geometry (accelerations.PIXEL_MEMORY; PIXEL_MEMORY_GB), so an image is decoded once
per geometry, not once per model."""

import os

from .errors import ModelError
from .memory import KEPT


def resolve_pixel_memory(value):
    """PIXEL_MEMORY_GB constant -> bytes per process: "auto" = a quarter of the memory this
    process may use (the machine's, or a smaller cgroup limit: containers, SLURM), shared
    by the processes torchrun starts on the node; 0 = off."""
    if value in (None, "auto"):
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return 0
        for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
            try:
                with open(limit_file) as f:
                    total = min(total, int(f.read().strip()))
            except (OSError, ValueError):
                pass  # absent, or "max": no limit
        return total // 4 // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    if not isinstance(value, (int, float)) or value < 0:
        raise ModelError(f"PIXEL_MEMORY_GB must be a number >= 0 or 'auto', got {value!r}")
    return int(value * 2**30)


class PixelMemory:
    """uint8 pixels (PixelSplit.geometry's output) of the images decoded in this process, kept in
    host memory for the later models with the same geometry (PixelSplit.key): the paper's five
    open_clip models share 224 px resize-and-crop pixels, its SigLIP 384 models theirs, its two
    SigLIP 224 models theirs, so each image is decoded once per geometry, not once per model.
    Keyed like the embedding cache (path, size, mtime); an unreadable file is not remembered (a
    later model tries it again, as its error may have been passing). Holds up to `budget` bytes: a
    geometry being decoded evicts the least recently used others, then, when still full, its further
    images are simply not kept (decoded again later).
    """

    def __init__(self, budget):
        import collections
        import threading

        self.budget, self.bytes = budget, 0
        self.geometries = collections.OrderedDict()  # key -> {"where": {image key: (chunk, row)}, "chunks", "bytes"}
        self.lock = threading.Lock()  # a Lookahead fills a later model's geometry from its own thread

    def get(self, key):
        """The remembered pixels of one geometry (most recently used now), or None."""
        with self.lock:
            if key in self.geometries:
                self.geometries.move_to_end(key)
            return self.geometries.get(key)

    def add(self, key, image_keys, batch, evict=True):
        """Keep a uint8 batch of one geometry; evict=False (pixels decoded ahead for a later
        model) keeps it only if it fits without dropping another geometry."""
        import torch

        if not image_keys or not torch.is_tensor(batch) or batch.dtype != torch.uint8:
            return
        if not evict and self.bytes + batch.numel() > self.budget:
            return  # (checked again below, under the lock)
        # out of pinned memory (outside the lock: it is the slow part), by one memcpy on this thread: torch's
        # clone splits a copy this size over its intra-op threads, which wait for CPUs that decoding workers hold
        kept = torch.from_numpy(batch.numpy().copy())
        with self.lock:
            g = self.geometries.setdefault(key, {"where": {}, "chunks": [], "bytes": 0})
            self.geometries.move_to_end(key)
            while evict and self.bytes + kept.numel() > self.budget and len(self.geometries) > 1:
                old = next(iter(self.geometries))
                if old == key:
                    break
                self.bytes -= self.geometries.pop(old)["bytes"]
            if self.bytes + kept.numel() > self.budget:
                return  # full: these images are decoded again by a later model
            g["chunks"].append(kept)
            g["bytes"] += kept.numel()
            self.bytes += kept.numel()
            for r, k in enumerate(image_keys):
                if k is not None:
                    g["where"][k] = (len(g["chunks"]) - 1, r)

    @staticmethod
    def batch(g, image_keys, pin=False):
        """uint8 [len(image_keys), 3, H, W] of remembered images of geometry `g` (a `get` result,
        held by the caller: an eviction meanwhile frees nothing it still uses), pinned for a GPU copy."""
        import torch

        first = g["chunks"][g["where"][image_keys[0]][0]]
        out = torch.empty((len(image_keys), *first.shape[1:]), dtype=torch.uint8, pin_memory=pin)
        # each image by numpy's memcpy on this thread: a torch copy per image is split over torch's intra-op
        # threads, and with the lookahead's workers holding the CPUs each such split waited milliseconds
        # (ViT-L-14's pass, 3,072 remembered images on an H200: 9.0 s against 2.5 s without the lookahead)
        dst, chunks = out.numpy(), {}
        for j, k in enumerate(image_keys):
            c, r = g["where"][k]
            if c not in chunks:
                chunks[c] = g["chunks"][c].numpy()
            dst[j] = chunks[c][r]
        return out


def pixel_memory(budget):
    """The process's PixelMemory (created on first use; its budget follows the latest caller)."""
    if KEPT.pixels is None:
        KEPT.pixels = PixelMemory(budget)
    memory = KEPT.pixels
    with memory.lock:
        memory.budget = budget
        while memory.bytes > budget and memory.geometries:  # a smaller budget: least recently used go first
            memory.bytes -= memory.geometries.popitem(last=False)[1]["bytes"]
    return memory


def forget_pixels():
    """Drop remembered pixels (a fresh process's state: bench.py times decoding too)."""
    KEPT.pixels = None
