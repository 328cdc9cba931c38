"""lgip.models.pixels: a model's image preprocessing cut in two (accelerations.PIXELS_ON_DEVICE):
uint8 geometry (decode, resize, crop) in the decoding workers, the float arithmetic on the
device, proven bit-identical to the CPU transform when the model loads (`check_pixel_split`)."""


class PixelSplit:
    """A model's image preprocessing cut in two, for speed: `geometry` (PIL RGB image -> uint8
    [3, H, W]: resize, crop; picklable, runs in the decoding workers) and `to_input` (a uint8
    batch -> the model's input on its device: scale to [0, 1], subtract the mean, divide by the
    std). The arithmetic repeats the CPU transform's float operations in the same order and
    precision (IEEE-exact on both: no reciprocals, no fused ops), so the input is bit-identical
    (`check_pixel_split` proves it on the model's device at load, else the CPU transform stays).
    Workers thus skip the float work and send 4x fewer bytes, and `key` names the geometry:
    models with equal keys get equal pixels (see PixelMemory).
    >>> split = pixel_split_openclip(preprocess)          # Resize, CenterCrop | ToTensor, Normalize
    >>> x = split.to_input(torch.stack([split.geometry(img)]), "cuda", torch.bfloat16)
    """

    def __init__(self, geometry, key, rescale, mean, std):
        self.geometry, self.key, self.rescale = geometry, key, rescale  # rescale: ("div32", 255) or ("mul64", 1/255)
        self.mean, self.std = [float(v) for v in mean], [float(v) for v in std]
        # (device, rescale, mean, std) -> their tensors, made once: a copy per batch would stall the GPU
        self._constants = {}

    def to_input(self, u8, device, dtype):
        import torch

        kind, value = self.rescale
        key = (str(device), self.rescale, tuple(self.mean), tuple(self.std))
        if key not in self._constants:
            wide = torch.float32 if kind == "div32" else torch.float64
            self._constants[key] = (
                torch.full((1, 1, 1, 1), value, dtype=wide, device=device),
                torch.tensor(self.mean, dtype=torch.float32, device=device).view(1, -1, 1, 1),
                torch.tensor(self.std, dtype=torch.float32, device=device).view(1, -1, 1, 1),
            )
        scale, mean, std = self._constants[key]
        x = u8.to(device, non_blocking=True)
        if kind == "div32":  # torchvision to_tensor: float32(x).div(255); a device divisor, never a reciprocal
            x = x.to(torch.float32) / scale
        else:  # transformers rescale: float32(float64(x) * factor)
            x = (x.to(torch.float64) * scale).to(torch.float32)
        return ((x - mean) / std).to(dtype)


class _PilToUint8:
    """PIL geometry transforms, then the image as uint8 [3, H, W] (to_tensor before its division)."""

    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, img):
        import numpy as np
        import torch

        for t in self.transforms:
            img = t(img)
        if img.mode != "RGB":
            raise ValueError(f"expected an RGB image after {self.transforms}, got mode {img.mode}")
        return torch.from_numpy(np.array(img, dtype=np.uint8, copy=True)).permute(2, 0, 1).contiguous()


def pixel_split_openclip(preprocess):
    """PixelSplit of an open_clip preprocess Compose([Resize/CenterCrop/MaybeConvertMode...,
    (Maybe)ToTensor, Normalize]); None for any other shape."""
    from torchvision import transforms as T

    steps = list(getattr(preprocess, "transforms", []))
    known = (T.Resize, T.CenterCrop)
    if (
        len(steps) < 3
        or type(steps[-2]).__name__ not in ("ToTensor", "MaybeToTensor")
        or not isinstance(steps[-1], T.Normalize)
        or not all(isinstance(t, known) or type(t).__name__ == "MaybeConvertMode" for t in steps[:-2])
    ):
        return None
    geometry = steps[:-2]
    key = "torchvision:" + "|".join(
        f"MaybeConvertMode({t.mode})" if type(t).__name__ == "MaybeConvertMode" else repr(t) for t in geometry
    )
    return PixelSplit(_PilToUint8(geometry), key, ("div32", 255.0), steps[-1].mean, steps[-1].std)


class _HfGeometry:
    """A transformers image processor run without rescale and normalize: uint8 [3, H, W]."""

    def __init__(self, image_processor):
        self.image_processor = image_processor

    def __call__(self, img):
        import torch

        x = self.image_processor(images=img, do_rescale=False, do_normalize=False, return_tensors="pt")["pixel_values"][
            0
        ]
        if x.dtype != torch.uint8:
            raise ValueError(f"{type(self.image_processor).__name__} without rescale gave {x.dtype}, not uint8")
        return x


def pixel_split_siglip(image_processor):
    """PixelSplit of a PIL SigLIP image processor (transformers 4.x SiglipImageProcessor, 5.x
    SiglipImageProcessorPil) that resizes, rescales and normalises, without a center crop, and
    returns pixel_values only; None for any other processor."""
    ip = image_processor
    if (
        type(ip).__name__ not in ("SiglipImageProcessor", "SiglipImageProcessorPil")
        or not (ip.do_resize and ip.do_rescale and ip.do_normalize)
        or getattr(ip, "do_center_crop", False)
    ):
        return None
    key = f"transformers:{type(ip).__name__}:{ip.size}:{int(ip.resample)}:{getattr(ip, 'do_convert_rgb', None)}"
    return PixelSplit(_HfGeometry(ip), key, ("mul64", float(ip.rescale_factor)), ip.image_mean, ip.image_std)


def check_pixel_split(enc, split):
    """`split` when its device input equals enc.image_transform's, bit for bit, on probe images
    (odd sizes, full value range) on the model's device; else None (the CPU transform is used)."""
    import numpy as np
    import torch
    from PIL import Image

    if split is None:
        return None
    rng = np.random.default_rng(0)
    probes = [Image.fromarray(rng.integers(0, 256, size, dtype=np.uint8)) for size in ((97, 131, 3), (300, 211, 3))]
    try:
        for img in probes:
            want = enc.image_transform(img)
            if not torch.is_tensor(want):
                return None
            got = split.to_input(split.geometry(img)[None], enc.device, torch.float32)[0]
            if got.shape != want.shape or not torch.equal(got.cpu(), want.float()):
                return None
    except Exception:  # any surprise: keep the CPU transform
        return None
    return split
