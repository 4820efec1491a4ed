"""What the model-type surveys (scratch/s54/model_type_sweep.py, scratch/s54/model_type_sweep.py --encoders) share."""
from fa4_inductor import hf


def tiny_configs_without_dropout() -> None:
    """hf.tiny_config with every dropout, jitter and pdrop rate 0 (active in training, Inductor's random numbers are
    not eager's)."""
    tiny_config = hf.tiny_config

    def without_dropout(*args, **kwargs):
        config = tiny_config(*args, **kwargs)
        for key, val in list(config.to_dict().items()):
            if isinstance(val, float) and ("dropout" in key or "jitter" in key or "pdrop" in key):
                try:
                    setattr(config, key, 0.0)
                except Exception:  # a derived property
                    pass
        return config

    hf.tiny_config = without_dropout


def rel(a, b) -> float:
    """The largest difference relative to b's largest magnitude."""
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item()
