"""Tiny transformers checkpoints for the tests, built offline in a few seconds:

- `hf_clip_from_openclip(folder)`: the fixture's tiny open_clip CLIP (tests/fixtures/models/openclip-tiny)
  as a transformers CLIPModel folder, its state dict mapped weight for weight, with a CLIPProcessor:
  the real CLIP BPE vocabulary rebuilt from open_clip's merges file (as CLIP's own tokenizer builds
  it) and an image processor doing what the open_clip preprocess does. Both types should give
  the same embeddings.
- `hf_altclip(folder)`: a random-init AltCLIPModel (XLM-R text tower: bidirectional, pooled at
  its first token, padding masked) with an XLM-R tokenizer over the fixture's small
  sentencepiece model, and a CLIP image processor.

    >>> hf_clip_from_openclip(tmp_path / "clip")     # then {"type": "transformers", "model_id": str(tmp_path / "clip")}
"""

import gzip
import json
import os

import torch

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
OPENCLIP_TINY_DIR = os.path.join(FIXTURES, "models", "openclip-tiny")
SPIECE = os.path.join(FIXTURES, "models", "siglip-tiny", "spiece.model")
OPENAI_MEAN, OPENAI_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]


def _bytes_to_unicode():
    """CLIP's byte -> printable character table (the GPT-2 one)."""
    bs = list(range(ord("!"), ord("~") + 1))
    bs += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def write_clip_vocab(folder):
    """vocab.json and merges.txt of the CLIP BPE, from open_clip's bpe_simple_vocab_16e6.txt.gz:
    the 256 byte characters, the same with "</w>", one token per merge, then the two specials."""
    from open_clip.tokenizer import default_bpe

    with gzip.open(default_bpe(), "rt", encoding="utf-8") as f:
        merges = f.read().split("\n")[1 : 49152 - 256 - 2 + 1]
    merges = [tuple(m.split()) for m in merges]
    vocab = list(_bytes_to_unicode().values())
    vocab = vocab + [v + "</w>" for v in vocab] + ["".join(m) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    with open(os.path.join(folder, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump({v: i for i, v in enumerate(vocab)}, f, ensure_ascii=False)
    with open(os.path.join(folder, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")


def _clip_image_processor(size):
    from transformers import CLIPImageProcessor

    return CLIPImageProcessor(
        size={"shortest_edge": size},
        crop_size={"height": size, "width": size},
        resample=3,
        image_mean=OPENAI_MEAN,
        image_std=OPENAI_STD,
    )


def _split_in_proj(prefix, sd, out, hf):
    w, b = sd[f"{prefix}.attn.in_proj_weight"], sd[f"{prefix}.attn.in_proj_bias"]
    for name, wp, bp in zip(("q_proj", "k_proj", "v_proj"), w.chunk(3), b.chunk(3)):
        out[f"{hf}.self_attn.{name}.weight"], out[f"{hf}.self_attn.{name}.bias"] = wp, bp
    out[f"{hf}.self_attn.out_proj.weight"] = sd[f"{prefix}.attn.out_proj.weight"]
    out[f"{hf}.self_attn.out_proj.bias"] = sd[f"{prefix}.attn.out_proj.bias"]
    for a, c in (("ln_1", "layer_norm1"), ("ln_2", "layer_norm2"), ("mlp.c_fc", "mlp.fc1"), ("mlp.c_proj", "mlp.fc2")):
        out[f"{hf}.{c}.weight"], out[f"{hf}.{c}.bias"] = sd[f"{prefix}.{a}.weight"], sd[f"{prefix}.{a}.bias"]


def openclip_state_to_hf(sd, layers_text, layers_vision):
    """An open_clip CLIP state dict as transformers CLIPModel's."""
    out = {
        "text_model.embeddings.token_embedding.weight": sd["token_embedding.weight"],
        "text_model.embeddings.position_embedding.weight": sd["positional_embedding"],
        "text_model.final_layer_norm.weight": sd["ln_final.weight"],
        "text_model.final_layer_norm.bias": sd["ln_final.bias"],
        "text_projection.weight": sd["text_projection"].T.contiguous(),
        "vision_model.embeddings.class_embedding": sd["visual.class_embedding"],
        "vision_model.embeddings.patch_embedding.weight": sd["visual.conv1.weight"],
        "vision_model.embeddings.position_embedding.weight": sd["visual.positional_embedding"],
        "vision_model.pre_layrnorm.weight": sd["visual.ln_pre.weight"],
        "vision_model.pre_layrnorm.bias": sd["visual.ln_pre.bias"],
        "vision_model.post_layernorm.weight": sd["visual.ln_post.weight"],
        "vision_model.post_layernorm.bias": sd["visual.ln_post.bias"],
        "visual_projection.weight": sd["visual.proj"].T.contiguous(),
        "logit_scale": sd["logit_scale"],
    }
    for i in range(layers_text):
        _split_in_proj(f"transformer.resblocks.{i}", sd, out, f"text_model.encoder.layers.{i}")
    for i in range(layers_vision):
        _split_in_proj(f"visual.transformer.resblocks.{i}", sd, out, f"vision_model.encoder.layers.{i}")
    return out


def hf_clip_from_openclip(folder):
    """The tiny open_clip CLIP saved as a transformers CLIPModel + CLIPProcessor folder."""
    import open_clip
    from transformers import CLIPConfig, CLIPModel, CLIPProcessor, CLIPTokenizer, CLIPTokenizerFast

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(OPENCLIP_TINY_DIR, "open_clip_config.json")) as f:
        cfg = json.load(f)["model_cfg"]
    vc, tc = cfg["vision_cfg"], cfg["text_cfg"]
    model = open_clip.create_model("local-dir:" + OPENCLIP_TINY_DIR)
    config = CLIPConfig(
        text_config=dict(
            vocab_size=tc["vocab_size"],
            hidden_size=tc["width"],
            intermediate_size=4 * tc["width"],
            num_hidden_layers=tc["layers"],
            num_attention_heads=tc["heads"],
            max_position_embeddings=tc["context_length"],
            hidden_act="gelu",
            layer_norm_eps=1e-5,
            bos_token_id=49406,
            eos_token_id=49407,
            pad_token_id=49407,
        ),
        vision_config=dict(
            hidden_size=vc["width"],
            intermediate_size=4 * vc["width"],
            num_hidden_layers=vc["layers"],
            num_attention_heads=vc["width"] // vc["head_width"],
            image_size=vc["image_size"],
            patch_size=vc["patch_size"],
            hidden_act="gelu",
            layer_norm_eps=1e-5,
        ),
        projection_dim=cfg["embed_dim"],
    )
    hf = CLIPModel(config)
    missing, unexpected = hf.load_state_dict(
        openclip_state_to_hf(model.state_dict(), tc["layers"], vc["layers"]), strict=False
    )
    assert not unexpected and all("position_ids" in k for k in missing), (missing, unexpected)
    hf.save_pretrained(folder)
    write_clip_vocab(folder)
    slow = CLIPTokenizer(os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt"))
    slow.model_max_length = tc["context_length"]
    slow.save_pretrained(folder)
    tok = CLIPTokenizerFast.from_pretrained(
        folder
    )  # (converted from the vocabulary, as the Hub's CLIP folders ship it)
    CLIPProcessor(image_processor=_clip_image_processor(vc["image_size"]), tokenizer=tok).save_pretrained(folder)
    return folder


def hf_altclip(folder, seed=0):
    """A tiny random-init AltCLIPModel + AltCLIPProcessor folder (XLM-R tokenizer over a small
    sentencepiece model)."""
    from transformers import AltCLIPConfig, AltCLIPModel, AltCLIPProcessor, XLMRobertaTokenizer

    os.makedirs(folder, exist_ok=True)
    tok = XLMRobertaTokenizer(SPIECE, model_max_length=64)
    config = AltCLIPConfig(
        text_config=dict(
            vocab_size=len(tok),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=66,
            project_dim=32,
            pad_token_id=tok.pad_token_id,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            type_vocab_size=1,
        ),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=64,
            patch_size=16,
        ),
        projection_dim=32,
    )
    torch.manual_seed(seed)
    model = AltCLIPModel(config)
    # Its own init (std 0.02 everywhere) gives every text the same embedding: weights of unit
    # gain instead, so texts differ as a trained model's do.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.text_model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 1.0 if "embeddings" in name else p.shape[1] ** -0.5, generator=g)
    model.save_pretrained(folder)
    AltCLIPProcessor(image_processor=_clip_image_processor(64), tokenizer=tok).save_pretrained(folder)
    return folder
