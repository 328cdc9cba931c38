"""lgip.models.towers: exact, faster forwards of the open_clip and SigLIP towers: open_clip
blocks through SDPA (is_causal for text), text batches cut to their longest text, prefix-packed
text, and last blocks run for the pooled position only. Each equals the tower's own forward to
float rounding (tests/test_towers.py, against open_clip's encode_text / encode_image and
transformers' get_text_features); lgip.accelerations switches them off.

    >>> x = _openclip_text_trimmed(
    ...     tower, _plain_blocks(tower.transformer), ids
    ... )  # = model.encode_text(ids padded to 77)
"""

from .prefix_packs import prefix_tree_mask


def _openclip_causal_text_tower(model):
    """The module holding an open_clip text tower that may be cut to its texts' real length
    (causal mask, EOT = argmax pooling, no pad mask or appended class token): the model itself
    for CLIP, `model.text` for CustomTextCLIP (EVA02, ...); None for any other tower."""
    import open_clip
    from open_clip.transformer import TextTransformer

    if isinstance(model, open_clip.CLIP):
        tower, pool = model, getattr(model, "text_pool_type", "argmax")
    elif isinstance(getattr(model, "text", None), TextTransformer):
        tower = model.text
        pool = tower.pool_type
        if tower.cls_emb is not None or getattr(tower, "use_pad_mask", False):
            return None
    else:
        return None
    return tower if pool == "argmax" and getattr(tower, "attn_mask", None) is not None else None


def _plain_blocks(transformer):
    """A transformer's blocks when each is a plain self-attention ResidualAttentionBlock
    (batch-first nn.MultiheadAttention), which `_sdpa_block` computes exactly; else None."""
    import torch
    from open_clip.transformer import ResidualAttentionBlock

    blocks = list(getattr(transformer, "resblocks", []))
    if not getattr(transformer, "batch_first", False) or not blocks:
        return None
    for b in blocks:
        a = getattr(b, "attn", None)
        if (
            type(b) is not ResidualAttentionBlock
            or hasattr(b, "ln_1_kv")
            or not isinstance(a, torch.nn.MultiheadAttention)
            or not a.batch_first
            or not a._qkv_same_embed_dim
            or a.bias_k is not None
        ):
            return None
    return blocks


def _sdpa_block(block, x, causal=False, mask=None, rows=None):
    """A plain ResidualAttentionBlock (see _plain_blocks) on [N, L, W] through SDPA, with
    open_clip's causal mask given as is_causal (flash attention on a GPU) instead of an additive
    [L, L] float mask, a boolean mask [N, L, L] (prefix trees, see PrefixPacks), or no mask
    (image towers; ~5% faster than nn.MultiheadAttention's own path on a ViT-B/16 on CPU).
    rows: the output of some positions only (a tower's last block, where only the pooled ones
    count): keys and values for every position, the query, output projection and MLP for these
    alone. An int: one position that attends every position (the last one under the causal
    mask, -1; the class token without a mask, 0) -> [N, 1, W]; a [N, E] index tensor (with a
    mask) -> [N, E, W]."""
    import torch
    import torch.nn.functional as F

    attn = block.attn
    n, length, width = x.shape
    heads = attn.num_heads
    h = block.ln_1(x)
    w, b = attn.in_proj_weight, attn.in_proj_bias
    if rows is None:
        q, k, v = F.linear(h, w, b).chunk(3, dim=-1)
    else:
        if isinstance(rows, int):
            one = slice(rows, rows + 1 if rows != -1 else None)

            def take(t):
                return t[:, one]
        else:

            def take(t):
                return torch.gather(t, 1, rows[..., None].expand(-1, -1, t.shape[-1]))

        q = F.linear(take(h), w[:width], None if b is None else b[:width])
        k, v = F.linear(h, w[width:], None if b is None else b[width:]).chunk(2, dim=-1)
        x = take(x)
        mask = take(mask) if mask is not None else None
    q, k, v = (t.reshape(n, -1, heads, width // heads).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(
        q, k, v, attn_mask=None if mask is None else mask[:, None], is_causal=causal and rows is None
    )
    x = x + block.ls_1(attn.out_proj(y.transpose(1, 2).reshape(n, -1, width)))
    return x + block.ls_2(block.mlp(block.ln_2(x)))


def _class_token_blocks(visual):
    """The blocks of an open_clip VisionTransformer that pools its class token alone (pool
    'tok', no attention pooling, no token outputs, plain blocks), for _openclip_image_pooled;
    else None (EVA02's timm tower, SigLIP's attention-pooled one: the full forward)."""
    from open_clip.transformer import VisionTransformer

    if (
        type(visual) is not VisionTransformer
        or getattr(visual, "attn_pool", None) is not None
        or getattr(visual, "pool_type", None) != "tok"
        or getattr(visual, "output_tokens", False)
        or not hasattr(visual, "_embeds")
    ):
        return None
    return _plain_blocks(visual.transformer)


def _openclip_image_pooled(visual, blocks, pixels):
    """open_clip VisionTransformer.forward, its blocks through SDPA, the last one run for the
    class token only (the pooled one): ~7% fewer image FLOPs for 12 blocks, 2.6% for 32."""
    x = visual._embeds(pixels)
    for block in blocks[:-1]:
        x = _sdpa_block(block, x)
    x = visual.ln_post(_sdpa_block(blocks[-1], x, rows=0)[:, 0])  # per-token LayerNorm: before or after the pool alike
    return x @ visual.proj if visual.proj is not None else x


def _openclip_text_packed(tower, blocks, tok, pos, path, creator, eot, slot, pooled=True):
    """open_clip encode_text of the texts of PrefixPacks arrays (on the device), in slot order.
    pooled: the last block runs for the texts' ends (eot) only; else for every node."""
    import torch

    cast = tower.transformer.get_cast_dtype()
    x = tower.token_embedding(tok).to(cast) + tower.positional_embedding[pos].to(cast)
    mask = prefix_tree_mask(pos, path, creator)
    for block in blocks[:-1]:
        x = _sdpa_block(block, x, mask=mask)
    if pooled:
        x = tower.ln_final(_sdpa_block(blocks[-1], x, mask=mask, rows=eot))
    else:
        x = _sdpa_block(blocks[-1], x, mask=mask)
        x = tower.ln_final(torch.gather(x, 1, eot[..., None].expand(-1, -1, x.shape[-1])))
    return _project_text(tower, x.reshape(-1, x.shape[-1])[slot])


def _openclip_text_trimmed(tower, blocks, ids, exact_length=False):
    """open_clip encode_text on a [N, L] batch with L <= context length (tower: see
    _openclip_causal_text_tower; blocks: _plain_blocks of its transformer, or None).
    exact_length: the caller promises every text ends (EOT) at the last column, as in the
    project's batches of one exact length; the last block then runs for that position only
    (the pooled one): ~7% fewer text FLOPs for 12 blocks, and no check on the device."""
    import torch

    cast = tower.transformer.get_cast_dtype()
    n = ids.shape[1]
    x = tower.token_embedding(ids).to(cast) + tower.positional_embedding[:n].to(cast)
    eot = ids.argmax(dim=-1)  # EOT has the largest id
    if blocks is None:
        x = tower.transformer(x, attn_mask=tower.attn_mask[:n, :n])
    elif exact_length:
        for block in blocks[:-1]:
            x = _sdpa_block(block, x, causal=True)
        return _project_text(tower, tower.ln_final(_sdpa_block(blocks[-1], x, causal=True, rows=-1))[:, 0])
    else:
        for block in blocks:
            x = _sdpa_block(block, x, causal=True)
    x = tower.ln_final(x)
    return _project_text(tower, x[torch.arange(x.shape[0], device=x.device), eot])


def _project_text(tower, x):
    import torch

    proj = tower.text_projection
    if proj is not None:
        x = proj(x) if isinstance(proj, torch.nn.Linear) else x @ proj
    return x


def _siglip_text_tower(model):
    """The SigLIP/SigLIP2 text tower (4.x: model.text_model.text_model's transformer; 5.x:
    model.text_model) when its parts are the ones _siglip_text_last computes; else None."""
    tower = getattr(model, "text_model", None)
    tower = getattr(tower, "text_model", tower)
    layers = getattr(getattr(tower, "encoder", None), "layers", None)
    if tower is None or not layers or not all(hasattr(tower, a) for a in ("embeddings", "final_layer_norm", "head")):
        return None
    for layer in layers:
        a = getattr(layer, "self_attn", None)
        if (
            not all(hasattr(layer, n) for n in ("layer_norm1", "layer_norm2", "mlp"))
            or a is None
            or not all(
                hasattr(a, n) for n in ("q_proj", "k_proj", "v_proj", "out_proj", "num_heads", "head_dim", "scale")
            )
        ):
            return None
    return tower


def _siglip_text_last(tower, ids):
    """SigLIP get_text_features without an attention mask, with the last layer run for the
    pooled (last) position only: keys and values for every position, the rest for one
    (~7% fewer text FLOPs for 12 layers, 3.5% for 24)."""
    import torch.nn.functional as F

    x = tower.embeddings(input_ids=ids)
    layers = tower.encoder.layers
    for layer in layers[:-1]:
        x = layer(x, None)
        x = x[0] if isinstance(x, tuple) else x
    last, n = layers[-1], x.shape[0]
    a = last.self_attn
    h = last.layer_norm1(x)
    q, k, v = a.q_proj(h[:, -1:]), a.k_proj(h), a.v_proj(h)
    q, k, v = (t.reshape(n, -1, a.num_heads, a.head_dim).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, scale=a.scale).transpose(1, 2).reshape(n, 1, -1)
    x = x[:, -1:] + a.out_proj(y)
    x = x + last.mlp(last.layer_norm2(x))
    return tower.head(tower.final_layer_norm(x)[:, 0])
