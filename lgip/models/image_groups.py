"""lgip.models.image_groups: a generative VLM's scores for several images in one forward
(accelerations.IMAGE_GROUPS), each image's row its prefix and then its texts packed, one block mask.

With the prefix reused and the texts packed (lgip.models.generative), LLaVA-1.5-7B still runs three
forwards per image (the prefix, two packs of texts) whose kernel launches cost the host more than the
device's work (an H200 busy 86 ms of the 233 ms each image took, bf16: benchmarks/BENCHMARKS.md). Here a
group of images runs as one forward and no key-value cache: row i is image i's shared prefix (the
template's opening, its image's tokens, the prompt), then each of its texts' rest, right-padded to a
width shared by few shapes (a multiple of WIDTH_STEP). Its mask lets each prefix token see the prefix
up to itself, each text token the prefix and its own text up to itself, each padding token itself only;
each text's tokens sit at the positions they have in the whole conversation (cut, cut + 1, ...). So
every scored token sees what it sees in one plain forward of its conversation: the same scores, to
float rounding (tests/test_generative.py). For families whose positions are one number per token and
whose image inputs stack along the batch (GROUP_FAMILIES); the others go per image.

    >>> group = ImageGroup(model, mean=False, size=8)
    >>> pending = group.add(items, cut)      # one image's (inputs, answer positions), its prefix length
    >>> pending.result()                     # runs the group (once `size` images wait, or now)
"""

from .generative import Pending

# LLaVA-1.5's family: one position per token, pixel_values of one shape per image (stacked for a batch).
# LLaVA-NeXT's tiles vary in number with the image's size and Qwen's positions are three numbers: per image.
GROUP_FAMILIES = ("llava",)
WIDTH_STEP = 128  # rows padded to a multiple of this: few shapes, whose attention plans are reused


def groupable(model, inputs):
    """True when an image with these processor `inputs` may join a group of `model`'s."""
    if getattr(model.config, "model_type", None) not in GROUP_FAMILIES:
        return False
    extra = set(inputs) - {"input_ids", "attention_mask", "token_type_ids", "pixel_values"}
    return not extra and "pixel_values" in inputs


class _Waiting(Pending):
    """An image's scores in a group not yet run: result() runs the group first."""

    def __init__(self, group, n):
        super().__init__(n=n)
        self._group = group

    def result(self):
        if self._group is not None:
            self._group.run()
            self._group = None
        return super().result()


class ImageGroup:
    """Images waiting to run together (module docstring). `add` returns each one's Pending; the group
    runs once `size` images wait, or when one's result is asked for."""

    def __init__(self, model, mean=False, size=8):
        self.model, self.mean, self.size = model, mean, max(1, int(size))
        self.waiting = []  # [(items, cut, its Pending)]

    def accepts(self, inputs):
        """True when an image with these processor `inputs` may join this group (groupable)."""
        return groupable(self.model, inputs)

    def add(self, items, cut):
        pending = _Waiting(self, len(items))
        self.waiting.append((items, cut, pending))
        if len(self.waiting) >= self.size:
            self.run()
        return pending

    def run(self):
        """Run every waiting image in one forward; their Pendings get their scores (on the device)."""
        if not self.waiting:
            return
        waiting, self.waiting = self.waiting, []
        for (_, _, pending), scores in zip(waiting, self._forward([(items, cut) for items, cut, _ in waiting])):
            pending.add(range(len(scores)), scores)
            pending._group = None

    def _forward(self, images):
        """[a tensor of each text's score] for each (items, cut) of `images`, from one forward."""
        import torch
        from .generative import _on

        model = self.model
        dtype = model.dtype
        rows, widths = [], []
        for items, cut in images:
            ids = [inp["input_ids"][0] for inp, _ in items]
            row = torch.cat([ids[0][:cut]] + [t[cut:] for t in ids])
            rows.append(row)
            widths.append(len(row))
        step = WIDTH_STEP
        width = -(-max(widths) // step) * step
        pad = getattr(model.config, "pad_token_id", None)
        pad = 0 if pad is None else pad
        x = torch.full((len(images), width), pad, dtype=torch.long)
        pos = torch.zeros((len(images), width), dtype=torch.long)
        seg = torch.full((len(images), width), -2, dtype=torch.long)  # -1: the prefix, j: text j, -2: padding
        local = torch.zeros((len(images), width), dtype=torch.long)
        targets, where, owners, counts, firsts = [], [], [], [], []
        for b, ((items, cut), row) in enumerate(zip(images, rows)):
            x[b, : len(row)] = row
            pos[b, :cut] = torch.arange(cut)
            seg[b, :cut] = -1
            local[b, :cut] = torch.arange(cut)
            offset = cut
            lengths = [inp["input_ids"].shape[1] - cut for inp, _ in items]
            if lengths:  # (each text's positions restart at cut; its tokens are one segment)
                end = cut + sum(lengths)
                starts = torch.tensor([0] + lengths[:-1]).cumsum(0).repeat_interleave(torch.tensor(lengths))
                steps = torch.arange(sum(lengths)) - starts
                pos[b, cut:end] = steps + cut
                local[b, cut:end] = steps
                seg[b, cut:end] = torch.arange(len(lengths)).repeat_interleave(torch.tensor(lengths))
            written = row[cut:].tolist()
            for j, ((_, positions), n) in enumerate(zip(items, lengths)):
                # token p of the whole conversation is predicted at p - 1: the prefix's last position for p = cut
                where += [b * width + (cut - 1 if p == cut else offset + p - 1 - cut) for p in positions]
                targets += [written[offset - cut + p - cut] for p in positions]
                owners += [len(counts)] * len(positions)
                counts.append(len(positions))
                offset += n
            firsts.append(len(counts) - len(items))
        device = model.device
        seg_d, local_d = seg.to(device), local.to(device)
        same = seg_d[:, :, None] == seg_d[:, None, :]
        earlier = local_d[:, None, :] <= local_d[:, :, None]
        prefix_col = (seg_d == -1)[:, None, :]
        text_row = (seg_d >= 0)[:, :, None]
        eye = torch.eye(width, dtype=torch.bool, device=device)[None]
        allowed = (
            (same & earlier & (seg_d[:, :, None] != -2)) | (text_row & prefix_col) | ((seg_d == -2)[:, :, None] & eye)
        )
        mask = torch.zeros((len(images), 1, width, width), dtype=dtype, device=device)
        mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
        pixels = torch.cat([items[0][0]["pixel_values"] for items, _ in images])
        inputs = _on({"pixel_values": pixels}, model)
        with torch.no_grad():
            logits = model(
                input_ids=x.to(device), attention_mask=mask, position_ids=pos.to(device), use_cache=False, **inputs
            ).logits
        flat = logits.reshape(-1, logits.shape[-1])
        where_d, targets_d, owners_d = (torch.tensor(v, dtype=torch.long).to(device) for v in (where, targets, owners))
        lp = torch.log_softmax(flat[where_d].float(), dim=-1).gather(1, targets_d[:, None])[:, 0]
        sums = torch.zeros(len(counts), dtype=torch.float32, device=device).index_add_(0, owners_d, lp)
        if self.mean:
            sums = sums / torch.tensor(counts, dtype=torch.float32).to(device)
        bounds = firsts + [len(counts)]
        return [sums[bounds[i] : bounds[i + 1]] for i in range(len(images))]
