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


class _HalfEmbeddingModel(torch.nn.Module):
    """encode_text gives [N] instead of [N, D]: a shape the run must name."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def encode_image(self, pixels):
        return self.model.encode_image(pixels)

    def encode_text(self, ids):
        return self.model.encode_text(ids).sum(-1)


def wrong_text_shape(device="cpu", dtype=torch.float32):
    model, preprocess, tokenizer = openclip_tiny(device, dtype)
    return _HalfEmbeddingModel(model), preprocess, tokenizer


def two_things(device="cpu", dtype=torch.float32):
    model, preprocess, _ = openclip_tiny(device, dtype)
    return model, preprocess
