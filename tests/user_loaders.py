"""Loaders of one's own, as a user writes them for `{"type": "python", "loader": "user_loaders.py:<function>"}`:
the fixture's tiny open_clip model through open_clip's own functions, and loaders that go wrong
in the ways the tests check (an exception in the user's code, a result of the wrong kind)."""

import os

import torch

TINY = "local-dir:" + os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "models", "openclip-tiny")


def openclip_tiny(device="cpu", dtype=torch.float32, name=TINY):
    import open_clip

    model, _, preprocess = open_clip.create_model_and_transforms(name, device=device, precision="fp32")
    return model.to(dtype=dtype).eval(), preprocess, open_clip.get_tokenizer(name)


def broken(device="cpu", dtype=torch.float32, checkpoint="epoch3.pt"):
    return _read_checkpoint(checkpoint)


def _read_checkpoint(path):
    raise FileNotFoundError(f"no checkpoint at {path}")


class Wrapped(torch.nn.Module):
    """A model of one's own around another's two methods (not an open_clip class: its own encode_* run as given)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def encode_image(self, pixels):
        return self.model.encode_image(pixels)

    def encode_text(self, ids):
        return self.model.encode_text(ids)


class _HalfEmbeddingModel(Wrapped):
    """encode_text gives [N] instead of [N, D]: a shape the run must name."""

    def encode_text(self, ids):
        return super().encode_text(ids).sum(-1)


def wrong_text_shape(device="cpu", dtype=torch.float32):
    model, preprocess, tokenizer = openclip_tiny(device, dtype)
    return _HalfEmbeddingModel(model), preprocess, tokenizer


def two_things(device="cpu", dtype=torch.float32):
    model, preprocess, _ = openclip_tiny(device, dtype)
    return model, preprocess


class _NonFiniteModel(torch.nn.Module):
    """The tiny model whose text embeddings are NaN for texts holding the token `token`, and whose
    image embeddings overflow to inf when `images` is True: as a model run in fp16 can."""

    def __init__(self, model, token, images):
        super().__init__()
        self.model, self.token, self.images = model, token, images

    def encode_image(self, pixels):
        out = self.model.encode_image(pixels)
        return out * float("inf") if self.images else out

    def encode_text(self, ids):
        out = self.model.encode_text(ids)
        return torch.where((ids == self.token).any(dim=1, keepdim=True), torch.full_like(out, float("nan")), out)


def non_finite(device="cpu", dtype=torch.float32, word="dog", images=False):
    model, preprocess, tokenizer = openclip_tiny(device, dtype)
    token = int(tokenizer([word])[0, 1])  # (after the start token)
    return _NonFiniteModel(model, token, images), preprocess, tokenizer


class _OverflowsLater(torch.nn.Module):
    """The tiny model whose image embeddings are inf from its second batch of several images on: the
    load's check (one image) and the original images (one batch) are finite, the altered ones (later
    batches) overflow."""

    def __init__(self, model):
        super().__init__()
        self.model, self.batches = model, 0

    def encode_image(self, pixels):
        self.batches += len(pixels) > 1
        out = self.model.encode_image(pixels)
        return out if self.batches <= 1 else out * float("inf")

    def encode_text(self, ids):
        return self.model.encode_text(ids)


def overflows_later(device="cpu", dtype=torch.float32):
    model, preprocess, tokenizer = openclip_tiny(device, dtype)
    return _OverflowsLater(model), preprocess, tokenizer


class _Slow(Wrapped):
    """The tiny model, each text batch 0.3 s slower and said ("encoded <n>"): a step slow enough to be stopped."""

    def encode_text(self, ids):
        import time

        time.sleep(0.3)
        print("encoded", len(ids), flush=True)
        return super().encode_text(ids)


def slow(device="cpu", dtype=torch.float32):
    model, preprocess, tokenizer = openclip_tiny(device, dtype)
    return _Slow(model), preprocess, tokenizer
