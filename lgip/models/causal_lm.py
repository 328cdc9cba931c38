"""lgip.models.causal_lm: type "causal_lm", a text-only language model (any transformers AutoModelForCausalLM,
its fast tokenizer) that scores a text by its log-likelihood (LGIP_SPEC.md 15, as section 13 defines it for a
text): ids = [b] + the text's ids without special tokens, b its BOS token (else its EOS token); s = the sum of
log P(id | the ids before it) over ids[1:] ("logprob") or their mean ("logprob_mean"). It never reads an
image: its scorer is lgip.scorers.text (a blind model in the evaluations; blind_audit.py's `lm:<name>`).

    {"name": "gpt2", "type": "causal_lm", "model_id": "openai-community/gpt2", "score": "logprob"}
"""

from ..errors import ModelError
from .cards import model_id_named
from .encoder import _Model, _download_hint, hf_config
from .families import Family, register
from .hub import model_id_files, model_id_paths

SCORES = ("logprob", "logprob_mean")


def check(spec):
    """ModelError naming the spec for a "score" that is not one of SCORES."""
    score = spec.get("score", "logprob")
    if score not in SCORES:
        raise ModelError(f"model {spec.get('name')!r}: score must be one of {', '.join(SCORES)}, got {score!r}")


class TextLM(_Model):
    """A causal language model scoring texts alone (module docstring): `score_texts(texts, batch_size)`."""

    weights_loaded = True

    def __init__(self, model, tokenizer, device, dtype, score_kind, first_id):
        self.model, self.tokenizer, self.device, self.dtype = model, tokenizer, device, dtype
        self.score_kind, self.first_id = score_kind, first_id
        self.settings = {"score": score_kind}  # (the cache's identity holds what a score depends on)
        self.info = {"first_token": first_id}

    def ids(self, text):
        return [self.first_id] + self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def score_texts(self, texts, batch_size=32):
        """s of each text, in order (texts of similar length batched, right-padded: each row's log-probabilities
        are those of the text alone, its padding masked out)."""
        import numpy as np
        import torch

        rows = [self.ids(t) for t in texts]
        order = sorted(range(len(rows)), key=lambda j: len(rows[j]))
        out = [0.0] * len(rows)
        with torch.no_grad():
            for start in range(0, len(order), batch_size):
                chunk = order[start : start + batch_size]
                width = max(len(rows[j]) for j in chunk)
                ids = torch.zeros((len(chunk), width), dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for r, j in enumerate(chunk):
                    ids[r, : len(rows[j])] = torch.tensor(rows[j])
                    mask[r, : len(rows[j])] = 1
                logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
                logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
                picked = logp.gather(2, ids[:, 1:].to(self.device)[..., None])[..., 0] * mask[:, 1:].to(self.device)
                sums = picked.sum(1).double().cpu().tolist()
                for r, j in enumerate(chunk):
                    n = len(rows[j]) - 1
                    value = sums[r] if self.score_kind == "logprob" else (sums[r] / n if n else 0.0)
                    out[j] = float(np.float32(value))  # (as the cache keeps it: a cached re-run scores the same)
        return out


class TextKey(_Model):
    """A causal LM without its weights (a re-run whose text scores are all in the cache)."""

    weights_loaded = False
    why_not = {}

    def __init__(self, score_kind):
        self.score_kind, self.settings, self.info = score_kind, {"score": score_kind}, {"weights_loaded": False}


def load_causal_lm(spec, protocol, device, dtype):
    """A TextLM of the spec's model_id (its weights and fast tokenizer: local, cached or from the Hub)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .dual_encoders import _transformers_dtype_kwarg

    check(spec)
    try:
        tokenizer = AutoTokenizer.from_pretrained(spec["model_id"], use_fast=True)
        model = AutoModelForCausalLM.from_pretrained(spec["model_id"], **_transformers_dtype_kwarg(dtype))
    except (OSError, ValueError) as e:
        raise _download_hint(spec, e) from e
    first = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if first is None:
        raise ModelError(
            f"model {spec['name']!r} ({spec['model_id']}): its tokenizer has neither a BOS nor an EOS token, so a "
            f"text's first token has nothing to be predicted from (LGIP_SPEC.md 15)"
        )
    model = model.to(device).eval()
    return TextLM(model, tokenizer, device, dtype, spec.get("score", "logprob"), first)


def _card(spec, model, enc):
    """Section 12's fields: architecture and family = config.model_type, every parameter a text one."""
    config = model.config if model is not None else hf_config(spec)
    total = sum(p.numel() for p in model.parameters()) if model is not None else None
    return {
        "architecture": config.model_type,
        "family": config.model_type,
        "params_total": total,
        "params_text": total,
        "params_image": 0,
        "context_length": getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None),
        "loss": "next-token",
    }


CAUSAL_LM = register(
    Family(
        "causal_lm",
        required="model_id",
        options=("score",),
        load=load_causal_lm,
        keys=lambda spec, protocol: TextKey(spec.get("score", "logprob")),
        scorer="text",
        score_kind=lambda spec: spec.get("score", "logprob"),
        hub_files=model_id_files,
        named=model_id_named,
        card=_card,
        check=check,
        local_paths=model_id_paths,
        about="a text-only language model scoring a text alone: a blind control (LGIP_SPEC.md 15)",
        label=lambda model_family: "text-only LM",
    )
)
