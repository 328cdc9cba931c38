"""lgip.alterations: the image side's alterations (LGIP_SPEC.md section 11), pure functions of the
decoded RGB image: image paraphrases that keep the meaning (`jpeg`, `downscale`, `crop`, `hflip`)
and image flips that change it by another record's image (`mix`, `patch`, after RoCOCO's
mix_images.py); which record lends its image (`flip_offset`, `partner`); the captions hflip leaves
out (`mentions_left_or_right`); and `AlteredImage`, the item the image loader's workers make the
pixels of (lgip.images) and the embedding cache keys (lgip.cache).

Every alteration is made from the decoded image x (PIL RGB, W x H) before the model's own
preprocessing, exactly as section 11 writes it, so any two implementations make the same pixels:
identical from run to run and machine to machine for the same SEED (with the same Pillow: `jpeg`
and the BICUBIC resizes are Pillow's own code).

    >>> from PIL import Image
    >>> x = Image.new("RGB", (5, 4), (200, 10, 0)); y = Image.new("RGB", (3, 3), (0, 110, 255))
    >>> alter(x, "mix", y).getpixel((0, 0))          # rint(0.9 * x + 0.1 * y)
    (180, 20, 26)
    >>> alter(x, "crop").size, alter(x, "downscale").size
    ((4, 4), (5, 4))
    >>> flip_offset(4, seed=0), [partner(r, 4, flip_offset(4, 0)) for r in range(4)]
    (2, [2, 3, 0, 1])
    >>> mentions_left_or_right("A dog on the Left."), mentions_left_or_right("leftover pizza")
    (True, False)
"""

import math
import random
import string
import unicodedata
from typing import NamedTuple, Optional

PARAPHRASE_KINDS = ("jpeg", "downscale", "crop", "hflip")  # meaning kept: the score should stay put
FLIP_KINDS = ("mix", "patch")  # meaning changed by another record's image: the score should drop
KINDS = PARAPHRASE_KINDS + FLIP_KINDS
JPEG_QUALITY = 30
CROP = 0.9  # crop keeps round(0.9 W) x round(0.9 H), centred
LAM = 0.9  # mix and patch: RoCOCO's lam, the share of the image kept (mix: 0.9 * x + 0.1 * y, as written)
LEFT_RIGHT = ("left", "right")
FORMAT = "alter1"  # in every altered image's cache key: bumped should an alteration ever change


def _jpeg(x):
    import io
    from PIL import Image

    buf = io.BytesIO()
    x.save(buf, format="JPEG", quality=JPEG_QUALITY)
    buf.seek(0)
    with Image.open(buf) as img:
        img.load()
        return img.convert("RGB")


def _downscale(x):
    from PIL import Image

    w, h = x.size
    return x.resize((max(1, w // 2), max(1, h // 2)), Image.BICUBIC).resize((w, h), Image.BICUBIC)


def _crop(x):
    w0, h0 = x.size
    w, h = round(CROP * w0), round(CROP * h0)  # Python's round: halves to even
    left, top = (w0 - w) // 2, (h0 - h) // 2
    return x.crop((left, top, left + w, top + h))


def _hflip(x):
    from PIL import ImageOps

    return ImageOps.mirror(x)


def other_at_size(y, size):
    """The other image as the flips use it: RGB, resized to x's (W, H) with BICUBIC."""
    from PIL import Image

    return y.convert("RGB").resize(size, Image.BICUBIC)


def _mix(x, y):
    import numpy as np
    from PIL import Image

    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(other_at_size(y, x.size), dtype=np.float64)
    return Image.fromarray(np.clip(np.rint(0.9 * a + 0.1 * b), 0, 255).astype(np.uint8), "RGB")


def patch_box(size, seed, r):
    """(x1, y1, x2, y2): the box of the other image `patch` pastes into an image of `size` (W, H), record r
    (its index among the readable records): cut = int(side * sqrt(1 - lam)), the centre drawn by
    numpy.random.default_rng([seed, r]).integers(W), then .integers(H), the box clipped to the image."""
    import numpy as np

    w, h = size
    cut_w, cut_h = int(w * math.sqrt(1 - LAM)), int(h * math.sqrt(1 - LAM))
    rng = np.random.default_rng([seed, r])
    cx, cy = int(rng.integers(w)), int(rng.integers(h))
    clip = lambda v, hi: min(max(v, 0), hi)
    return (clip(cx - cut_w // 2, w), clip(cy - cut_h // 2, h), clip(cx + cut_w // 2, w), clip(cy + cut_h // 2, h))


def _patch(x, y, seed, r):
    import numpy as np
    from PIL import Image

    x1, y1, x2, y2 = patch_box(x.size, seed, r)
    out = np.array(x, dtype=np.uint8)  # (a copy: x is left as it is)
    out[y1:y2, x1:x2] = np.asarray(other_at_size(y, x.size), dtype=np.uint8)[y1:y2, x1:x2]
    return Image.fromarray(out, "RGB")


def alter(x, kind, y=None, seed=0, r=0):
    """x (a decoded PIL RGB image) altered by `kind`, a new PIL RGB image (x is not changed); `y`
    (the other record's decoded image), `seed` and `r` (x's record index among the readable records)
    are used by the flips only. A ValueError for an unknown kind or a flip without y."""
    if kind not in KINDS:
        raise ValueError(f"unknown image alteration {kind!r}; valid: {', '.join(KINDS)}")
    if x.mode != "RGB":
        raise ValueError(f"alterations take RGB images, got mode {x.mode}")
    if kind in FLIP_KINDS:
        if y is None:
            raise ValueError(f"the {kind} flip needs the other record's image")
        return _mix(x, y) if kind == "mix" else _patch(x, y, seed, r)
    return {"jpeg": _jpeg, "downscale": _downscale, "crop": _crop, "hflip": _hflip}[kind](x)


def flip_offset(n, seed):
    """k of pi(r) = (r + k) mod n: 1 + random.Random(seed).randrange(n - 1), a rotation that never
    gives a record its own image; None when n < 2 (no flips)."""
    if n < 2:
        return None
    return 1 + random.Random(seed).randrange(n - 1)


def partner(r, n, k):
    """pi(r): the index, among the n readable records, of the record whose image r's flips mix in."""
    return (r + k) % n


def _strip_punctuation(word):
    """The word less the punctuation at its ends: ASCII's, and Unicode's (curly quotes, guillemets, an
    ellipsis: COCO's captions have them)."""

    def punct(c):
        return c in string.punctuation or unicodedata.category(c).startswith("P")

    i, j = 0, len(word)
    while i < j and punct(word[i]):
        i += 1
    while j > i and punct(word[j - 1]):
        j -= 1
    return word[i:j]


def mentions_left_or_right(caption):
    """True when a whitespace word of the caption, lowercased with the punctuation at its ends stripped,
    is "left" or "right": hflip would make such a caption false, so it makes no hflip pair."""
    return any(_strip_punctuation(w.lower()) in LEFT_RIGHT for w in caption.split())


class AlteredImage(NamedTuple):
    """One altered image to make and encode, by name only (it travels to the decoding workers):
    the source image file, the kind, and for a flip the other record's image file, SEED and r (the
    source record's index among the readable records). Its cache key (`cache_key`) is the source
    image's key (path, size, mtime), the kind, SEED and the alterations' FORMAT and Pillow version
    (jpeg and the resizes are Pillow's code); a flip's pixels also depend on the other image and,
    for patch, on r, so a flip's key adds the other image's key and r (a record made unreadable
    before it moves every later r, and their flips are made again). Its key never equals an
    original image's, so neither the cache nor the pixel memory confuses the two."""

    source: str
    kind: str
    other: Optional[str] = None
    seed: int = 0
    r: int = 0

    def make(self, open_image):
        """The altered PIL RGB image; open_image(path) decodes a file to RGB (lgip.images)."""
        y = open_image(self.other) if self.kind in FLIP_KINDS else None
        return alter(open_image(self.source), self.kind, y, self.seed, self.r)

    def cache_key(self, key_of):
        """key_of(path): an image file's cache key (OSError when it is missing)."""
        import PIL

        key = f"{key_of(self.source)}|{self.kind}|seed={self.seed}|{FORMAT}|pillow={PIL.__version__}"
        if self.kind in FLIP_KINDS:
            key += f"|other={key_of(self.other)}|r={self.r}"
        return key
