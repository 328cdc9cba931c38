"""lgip.wise: WiSE-FT, the weight-space ensemble of a start model and its fine-tuned arm (LGIP_SPEC.md 16,
FINETUNE["wise"]; Wortsman et al.): a model whose every floating-point tensor of the state dict is
(1 - alpha) start + alpha arm, its other tensors (integer buffers) the arm's, saved as an arm is saved (section 14:
`model/` of the start's type and its MODELS spec in `model_spec.json`), so every evaluation probes it as it probes
the arm. alpha 0 is the start's weights exactly, 1 the arm's.

    >>> state, counts = interpolate(start.state_dict(), arm.state_dict(), 0.5)
    >>> spec, counts = save_wise(start_spec, arm_spec, 0.5, "x__ft_m__ft_lgip__wise0.5", "m__ft_lgip__wise0.5")
"""

import os


def wise_name(arm_name, alpha):
    """The WiSE-FT point's name: `<arm>__wise<alpha as %g>` (an arm's name is `<model>__ft_<arm>`)."""
    return f"{arm_name}__wise{alpha:g}"


def check_alphas(alphas, where='FINETUNE["wise"]'):
    """The WiSE-FT alphas as given (a list of numbers in [0, 1], [] none), sorted and without repeats; ConfigError
    naming `where` otherwise."""
    from .errors import ConfigError

    ok = isinstance(alphas, (list, tuple)) and all(
        isinstance(a, (int, float)) and not isinstance(a, bool) and 0 <= a <= 1 for a in alphas
    )
    if not ok:
        raise ConfigError(f"{where} must be a list of numbers from 0 to 1 (the arm's weight; [] none), got {alphas!r}")
    return sorted({f"{a:g}": float(a) for a in alphas}.values())


def interpolate(start, arm, alpha):
    """(state dict, {"interpolated": n, "from_arm": m}): each floating-point tensor (1 - alpha) start + alpha arm,
    computed in float64 and stored in the arm's dtype (alpha 0 gives the start's values and 1 the arm's, exactly),
    every other tensor the arm's. The two state dicts must have the same keys and shapes (one architecture): a
    ModelError names the first that differs."""
    import torch

    from .errors import ModelError

    if set(start) != set(arm):
        only = sorted(set(start) ^ set(arm))[:3]
        raise ModelError(f"the start and the arm are not one architecture: their weights differ in {only}")
    out, counts = {}, {"interpolated": 0, "from_arm": 0}
    for key, b in arm.items():
        a = start[key]
        if not torch.is_tensor(b) or not b.is_floating_point():
            out[key] = b.clone() if torch.is_tensor(b) else b
            counts["from_arm"] += 1
            continue
        if tuple(a.shape) != tuple(b.shape):
            raise ModelError(
                f"the start and the arm are not one architecture: {key} is {tuple(a.shape)} and {tuple(b.shape)}"
            )
        mixed = (1.0 - alpha) * a.detach().to("cpu", torch.float64) + alpha * b.detach().to("cpu", torch.float64)
        out[key] = mixed.to(b.dtype)
        counts["interpolated"] += 1
    return out, counts


def save_wise(start, arm, alpha, folder, run_name, device="cpu"):
    """The WiSE-FT point of `start` and `arm` (MODELS specs of one trainable family, lgip.models.trainable) at
    `alpha`, saved in `folder` as finetune_lgip.py saves an arm: `model/` (the start's type) and `model_spec.json`.
    Returns (the saved model's MODELS spec, interpolate's counts)."""
    from .errors import ConfigError
    from .models.families import family
    from .outputs import write_json

    if family(start) is not family(arm):
        raise ConfigError(
            f"the arm {arm.get('name')!r} is of type {arm.get('type')!r} and its start {start.get('name')!r} of type "
            f"{start.get('type')!r}: WiSE-FT mixes the weights of one architecture"
        )
    build = family(start).trainable
    if build is None:
        raise ConfigError(f"model {start.get('name')!r} is of type {start.get('type')!r}, which cannot be built here")
    first = build(start, device)
    weights = {k: v.detach().to("cpu").clone() for k, v in first.model.state_dict().items()}
    del first  # (one model in memory beside the weights)
    towers = build(arm, device)
    state, counts = interpolate(weights, towers.model.state_dict(), alpha)
    towers.model.load_state_dict(state)
    towers.model.eval()
    spec = towers.save(os.path.abspath(os.path.join(folder, "model")), run_name, True)
    write_json(os.path.join(folder, "model_spec.json"), spec, output=False)
    return spec, counts
