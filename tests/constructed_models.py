"""Models whose embeddings are built by hand, as `{"type": "python", "loader": "constructed_models.py:build",
"kwargs": {...}}`, for the text-prior controls (LGIP_SPEC.md section 9): each image's embedding is
a seeded random unit vector of its pixels; each text's a seeded random vector of its words, plus
what the mode puts in.
  mode "random": nothing more (a model that knows nothing);
  mode "prior":  every image leans on one shared direction u, and every CAPTION (the texts in
                 `captions`) carries u too: a caption beats its flip on any image, by text alone;
  mode "image":  a caption carries its OWN image's vector (the image named for it in `captions`):
                 it beats its flip on its image, not on the others.
"""

import zlib

import numpy as np
import torch

DIM = 64
LENGTH = 256  # the tokenizer: a text's UTF-8 bytes (+1) as its ids, padded with 0 (stateless: it may run in workers)


def _unit(seed, dim=DIM):
    v = np.random.default_rng(seed).standard_normal(dim)
    return v / np.linalg.norm(v)


def _image_key(img):
    """A number that tells images apart (their pixels' checksum), carried through preprocess."""
    return zlib.crc32(np.asarray(img.convert("RGB"), dtype=np.uint8).tobytes()) % (1 << 20)


class Constructed(torch.nn.Module):
    def __init__(self, mode, captions, image_keys, weight):
        super().__init__()
        self.mode, self.captions, self.image_keys, self.weight = mode, captions, image_keys, weight
        self.shared = _unit(12345)
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def image_vector(self, key):
        v = _unit(int(key) + 1)
        return v + self.weight * self.shared if self.mode == "prior" else v

    def text_vector(self, text):
        v = _unit(zlib.crc32(text.encode("utf-8")) + (1 << 21))
        if text in self.captions and self.mode == "prior":
            v = v + self.weight * self.shared
        elif text in self.captions and self.mode == "image":
            v = v + self.weight * _unit(self.image_keys[self.captions[text]] + 1)
        return v

    def encode_image(self, pixels):
        keys = pixels.reshape(len(pixels), -1)[:, 0].round().long().tolist()
        return torch.tensor(np.stack([self.image_vector(k) for k in keys]), dtype=torch.float32)

    def encode_text(self, ids):
        texts = [bytes(int(x) - 1 for x in row if int(x)).decode("utf-8") for row in ids]
        return torch.tensor(np.stack([self.text_vector(t) for t in texts]), dtype=torch.float32)


def build(device="cpu", dtype=torch.float32, mode="random", captions=None, weight=3.0):
    """captions: {caption text: its image file} (modes "prior" and "image")."""
    from PIL import Image

    captions = captions or {}
    keys = {}
    for path in set(captions.values()):
        with Image.open(path) as img:
            keys[path] = _image_key(img)
    model = Constructed(mode, captions, keys, weight)

    def preprocess(img):
        return torch.full((1, 1, 1), float(_image_key(img)))

    def tokenizer(texts):
        ids = torch.zeros((len(texts), LENGTH), dtype=torch.long)
        for j, t in enumerate(texts):
            b = list(t.encode("utf-8"))[:LENGTH]
            ids[j, : len(b)] = torch.tensor(b) + 1
        return ids

    return model, preprocess, tokenizer
