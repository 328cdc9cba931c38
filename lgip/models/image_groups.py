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


def head_apart(model):
    """True when `model`'s body and language-model head can run apart (.model, .lm_head: LLaVA's), so the head runs
    on the scored positions only (accelerations.SCORED_LOGITS)."""
    return hasattr(model, "model") and hasattr(model, "lm_head")


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

    def __init__(self, model, mean=False, size=8, lists=False, scored_logits=False):
        self.model, self.mean, self.size = model, mean, max(1, int(size))
        # lists (accelerations.TOKEN_LISTS): images come as TokenLists (submit_lists), their rows built as lists and
        # made tensors once per group; scored_logits (accelerations.SCORED_LOGITS): the language model's head run on
        # the scored positions only, not on every position of every row
        self.lists, self.scored_logits = lists, scored_logits
        self.waiting = []  # [(items or a TokenLists, cut, its Pending)]

    def accepts(self, inputs):
        """True when an image with these processor `inputs` may join this group (groupable)."""
        return groupable(self.model, inputs)

    def submit_lists(self, image, convs, conversations):
        """generative.submit's work for one image by TokenLists (self.lists): its Pending in this group, or None
        where the image takes the usual path (the splice refused, per-token inputs, a prefix not past the image)."""
        from .generative import _check_length, _last_image_token

        listed = conversations.lists(image, convs)
        if listed is None or not self.accepts(listed.inputs):
            return None
        for ids, (_, answer) in zip(listed.ids, convs):
            _check_length(self.model, ids, answer)
        cut = _shared_list_length(listed.ids, min(pos[0] for pos in listed.positions))
        if cut <= _last_image_token(self.model, listed.ids[0]):
            return None
        return self.add(listed, cut)

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
        """[a tensor of each text's score] for each (items or TokenLists, cut) of `images`, from one forward."""
        if self.lists:
            return self._forward_lists(images)
        return self._forward_items(images)

    def _forward_items(self, images):
        """_forward for (items, cut): the rows built per text from its tensor."""
        import torch

        model = self.model
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
        pixels = torch.cat([items[0][0]["pixel_values"] for items, _ in images])
        return self._run(x, pos, seg, local, pixels, (where, targets, owners, counts, firsts))

    def _forward_lists(self, images):
        """_forward for (TokenLists, cut): each row's ids, positions and segments written as numpy arrays from the
        texts' lists, made tensors once for the group (the same inputs as _forward_items')."""
        import numpy as np
        import torch
        from .conversations import TokenLists

        images = [  # (an image that came as items, its splice refused: its ids read once)
            (
                x
                if isinstance(x, TokenLists)
                else TokenLists(x[0][0], [i["input_ids"][0].tolist() for i, _ in x], [p for _, p in x]),
                cut,
            )
            for x, cut in images
        ]
        rows = [ids[0][:cut] + [t for text in ids for t in text[cut:]] for ids, cut in ((i.ids, c) for i, c in images)]
        width = -(-max(map(len, rows)) // WIDTH_STEP) * WIDTH_STEP
        pad = getattr(self.model.config, "pad_token_id", None)
        n = len(images)
        x = np.full((n, width), 0 if pad is None else pad, dtype=np.int64)
        pos, local = np.zeros((n, width), dtype=np.int64), np.zeros((n, width), dtype=np.int64)
        seg = np.full((n, width), -2, dtype=np.int64)  # -1: the prefix, j: text j, -2: padding
        where, targets, owners, counts, firsts = [], [], [], [], []
        for b, ((listed, cut), row) in enumerate(zip(images, rows)):
            x[b, : len(row)] = row
            lengths = np.array([len(ids) - cut for ids in listed.ids], dtype=np.int64)
            starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
            text = np.repeat(np.arange(len(lengths)), lengths)
            steps = np.arange(int(lengths.sum())) - np.repeat(starts, lengths)
            local[b, : len(row)] = np.concatenate([np.arange(cut), steps])  # (each text's positions restart at cut)
            pos[b, : len(row)] = np.concatenate([np.arange(cut), steps + cut])
            seg[b, : len(row)] = np.concatenate([np.full(cut, -1), text])
            firsts.append(len(counts))
            for j, (ids, positions) in enumerate(zip(listed.ids, listed.positions)):
                # token p of the whole conversation is predicted at p - 1: the prefix's last position for p = cut
                offset = cut + int(starts[j])
                where += [b * width + (cut - 1 if p == cut else offset + p - 1 - cut) for p in positions]
                targets += [ids[p] for p in positions]
                owners += [len(counts)] * len(positions)
                counts.append(len(positions))
        x, pos, seg, local = (torch.from_numpy(a) for a in (x, pos, seg, local))
        pixels = torch.cat([listed.inputs["pixel_values"] for listed, _ in images])
        return self._run(x, pos, seg, local, pixels, (where, targets, owners, counts, firsts))

    def _run(self, x, pos, seg, local, pixels, scored):
        """The group's forward on its rows (ids, positions, segments, positions within a segment) and pixels, and
        each image's scores from `scored` (the flat position predicting each scored token, the token, its text,
        each text's count of tokens, each image's first text)."""
        import torch
        from .generative import _on

        model = self.model
        dtype, device = model.dtype, model.device
        where, targets, owners, counts, firsts = scored
        n, width = x.shape
        mask = _block_mask(seg.to(device), local.to(device), width, dtype)
        inputs = _on({"pixel_values": pixels}, model)
        where_d, targets_d, owners_d = (torch.tensor(v, dtype=torch.long).to(device) for v in (where, targets, owners))
        with torch.no_grad():
            if self.scored_logits:  # (the head on the scored positions only: the same rows of the same product)
                hidden = model.model(
                    input_ids=x.to(device), attention_mask=mask, position_ids=pos.to(device), use_cache=False, **inputs
                )[0]
                picked = model.lm_head(hidden.reshape(-1, hidden.shape[-1])[where_d])
            else:
                logits = model(
                    input_ids=x.to(device), attention_mask=mask, position_ids=pos.to(device), use_cache=False, **inputs
                ).logits
                picked = logits.reshape(-1, logits.shape[-1])[where_d]
        lp = torch.log_softmax(picked.float(), dim=-1).gather(1, targets_d[:, None])[:, 0]
        sums = torch.zeros(len(counts), dtype=torch.float32, device=device).index_add_(0, owners_d, lp)
        if self.mean:
            sums = sums / torch.tensor(counts, dtype=torch.float32).to(device)
        bounds = firsts + [len(counts)]
        return [sums[bounds[i] : bounds[i + 1]] for i in range(n)]


def _block_mask(seg, local, width, dtype):
    """The additive mask of rows of segments `seg` (-1: the prefix, j >= 0: text j, -2: padding) at positions `local`
    within their segment: a prefix token sees the prefix up to itself, a text token the prefix and its own text up to
    itself, a padding token itself."""
    import torch

    device = seg.device
    same = seg[:, :, None] == seg[:, None, :]
    earlier = local[:, None, :] <= local[:, :, None]
    prefix_col = (seg == -1)[:, None, :]
    text_row = (seg >= 0)[:, :, None]
    eye = torch.eye(width, dtype=torch.bool, device=device)[None]
    allowed = (same & earlier & (seg[:, :, None] != -2)) | (text_row & prefix_col) | ((seg == -2)[:, :, None] & eye)
    mask = torch.zeros((seg.shape[0], 1, width, width), dtype=dtype, device=device)
    mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
    return mask


def _shared_list_length(ids, limit):
    """How many leading tokens every id list shares, at most `limit` (generative._shared_length's, on lists)."""
    first, m = ids[0], min([limit] + [len(t) for t in ids])
    for t in ids[1:]:
        if t[:m] != first[:m]:
            m = next(i for i in range(m) if t[i] != first[i])
    return m
