"""GPT-2 against PyTorch: bench/gpt2/gpt2_compare.py in its smoke configuration (2 layers, 64
wide, context 64) on cpu:0 and on cuda:0 when present: PyTorch's weights saved with safetensors
and loaded into backplane.models.GPT give PyTorch's f32 logits (max |diff| / max |ref| <= 1e-4)
and one bf16 autocast AdamW step's losses within 1e-2. Skipped without PyTorch (the reference).
Also GPTConfig.gelu_approximate and AdamW(fused=True) from Python."""
import importlib.util
import os

import numpy as np
import pytest

import backplane as bp
from conftest import DEVICES, SEED

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "gpt2",
                      "gpt2_compare.py")


def _compare_module():
    pytest.importorskip("torch", reason="PyTorch is not installed: it is the reference model")
    pytest.importorskip("safetensors", reason="safetensors is not installed: it carries the "
                        "weights from PyTorch to Backplane")
    if not os.path.exists(SCRIPT):
        pytest.skip(f"{SCRIPT} is not here (an installed wheel without the sources)")
    spec = importlib.util.spec_from_file_location("gpt2_compare", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("device", [d for d in DEVICES if d.type in ("cpu", "cuda")], ids=str)
def test_gpt2_smoke_matches_pytorch(device):
    mod = _compare_module()
    import torch

    if device.type == "cuda" and not torch.cuda.is_available():
        pytest.skip("this PyTorch has no CUDA")
    r = mod.compare(str(device), mod.SMOKE, batch=2, seq=mod.SMOKE["block_size"], seed=SEED)
    assert r["logits_max_abs_diff_over_max_abs_ref"] <= mod.LOGIT_TOL, r
    assert abs(r["loss_bp"] - r["loss_torch"]) <= mod.LOSS_TOL, r
    assert abs(r["loss_after_step_bp"] - r["loss_after_step_torch"]) <= mod.LOSS_TOL, r
    # The step changed the loss (the update ran on both sides).
    assert r["loss_after_step_bp"] != r["loss_bp"], r


def test_gpt_gelu_approximate(rng):
    cfg = dict(block_size=8, vocab_size=13, n_layer=1, n_head=2, n_embd=16)
    tokens = bp.from_numpy(rng.integers(0, 13, size=(2, 8), dtype=np.int64))
    bp.manual_seed(3)
    exact = bp.models.GPT(bp.models.GPTConfig(**cfg))
    bp.manual_seed(3)
    tanh = bp.models.GPT(bp.models.GPTConfig(**cfg, gelu_approximate="tanh"))
    with bp.no_grad():
        a, b = exact(tokens).numpy(), tanh(tokens).numpy()
    assert a.shape == (2, 8, 13) and not np.array_equal(a, b)
    np.testing.assert_allclose(a, b, atol=1e-2)  # the two forms differ by < 1e-3 per GELU
    with pytest.raises(bp.Error, match='gelu_approximate must be "none" or "tanh"'):
        bp.models.GPT(bp.models.GPTConfig(**cfg, gelu_approximate="erf"))


@pytest.mark.parametrize("kind", ["AdamW", "Adam"])
def test_fused_adam_equals_per_op_update(device, rng, kind):
    shapes = [(7, 13), (31,), (1,), (4, 3, 5)]
    init = [rng.uniform(-2, 2, size=s).astype(np.float32) for s in shapes]
    ps = [[bp.from_numpy(v.copy()).to(device).requires_grad_() for v in init] for _ in range(2)]
    make = getattr(bp.optim, kind)
    fused = make(ps[0], lr=1e-2, weight_decay=0.1, fused=True)
    plain = make(ps[1], lr=1e-2, weight_decay=0.1, fused=False)
    for _ in range(20):
        for a, b in zip(*ps):
            g = rng.uniform(-1, 1, size=tuple(a.shape)).astype(np.float32)
            a.grad = bp.from_numpy(g).to(device)
            b.grad = bp.from_numpy(g.copy()).to(device)
        fused.step()
        plain.step()
    for a, b in zip(*ps):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=4e-5, atol=4e-6)
    sa, sb = fused.state_dict()["state"], plain.state_dict()["state"]
    for k in sa:
        for key in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_allclose(sa[k][key].numpy(), sb[k][key].numpy(), rtol=4e-5,
                                       atol=1e-7)
