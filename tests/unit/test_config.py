"""ModelConfig validation (clear errors naming field, value and limit), presets and round trips."""

import pytest

from scratchlm.config import ModelConfig, get_preset


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"d_model": 100, "n_heads": 3}, "d_model=100 must be divisible by n_heads=3"),
        ({"n_heads": 4, "n_kv_heads": 3}, "n_heads=4 must be divisible by n_kv_heads=3"),
        ({"d_model": 36, "n_heads": 4}, "head_dim=9 must be even for RoPE"),
        ({"vocab_size": 0}, "vocab_size must be a positive integer, got 0"),
        ({"norm": "batchnorm"}, "norm='batchnorm' is not one of"),
        ({"rope_style": "neox"}, "rope_style='neox' is not one of"),
        ({"norm_eps": 0.0}, "norm_eps must be > 0"),
    ],
)
def test_config_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ModelConfig(**kwargs)


def test_unknown_preset_lists_presets() -> None:
    with pytest.raises(ValueError, match="available presets:.*llama-tiny"):
        get_preset("llama-huge")


def test_unknown_field_names_it() -> None:
    with pytest.raises(ValueError, match=r"unknown ModelConfig field\(s\) \['n_layer'\]"):
        ModelConfig.from_dict({"n_layer": 3})


def test_defaults_and_round_trip(tmp_path) -> None:
    c = get_preset("llama-tiny", d_model=240, n_heads=6, n_kv_heads=None)
    assert c.n_kv_heads == 6 and c.head_dim == 40 and c.d_ff == 640  # sizes re-derived: 8/3*240 = 640
    assert c.replace(d_ff=100).d_ff == 100 and c.replace(d_model=120).head_dim == 20
    assert get_preset("gpt2-tiny").d_ff == 4 * 128
    c.save(tmp_path / "c.json")
    assert ModelConfig.load(tmp_path / "c.json") == c
