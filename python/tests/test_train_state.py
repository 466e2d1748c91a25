"""AdamW over parameter groups against a NumPy float64 reference, the schedulers' landmarks,
and checkpoints: a resumed run's losses equal the uninterrupted run's, mismatches refused."""
import math

import numpy as np
import pytest

import backplane as bp
from backplane import nn
from backplane.optim import lr_scheduler


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_adamw_groups_match_a_float64_reference(device, rng):
    a0, b0 = f32(rng, 3, 4), f32(rng, 5)
    a = bp.tensor(a0, device=device, requires_grad=True)
    b = bp.tensor(b0, device=device, requires_grad=True)
    opt = bp.optim.AdamW([{"params": [a]}, {"params": [b], "lr": 0.05, "weight_decay": 0.0}],
                         lr=0.01, weight_decay=0.1)
    assert opt.param_groups[1]["betas"] == (0.9, 0.999)
    ref = [[a0.astype(np.float64), 0.0, 0.0, 0.01, 0.1], [b0.astype(np.float64), 0.0, 0.0, 0.05, 0.0]]
    for t in range(1, 4):
        grads = [f32(rng, 3, 4), f32(rng, 5)]
        a.grad, b.grad = bp.tensor(grads[0], device=device), bp.tensor(grads[1], device=device)
        opt.step()
        for r, g in zip(ref, grads):
            p, m, v, lr, wd = r
            p = p * (1 - lr * wd)
            m = 0.9 * m + 0.1 * g
            v = 0.999 * v + 0.001 * g.astype(np.float64) ** 2
            p = p - lr / (1 - 0.9 ** t) * m / (np.sqrt(v) / math.sqrt(1 - 0.999 ** t) + 1e-8)
            r[:3] = p, m, v
    np.testing.assert_allclose(a.numpy(), ref[0][0], rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(b.numpy(), ref[1][0], rtol=2e-6, atol=2e-6)
    sd = opt.state_dict()
    assert sd["state"][1]["step"].item() == 3 and sd["param_groups"][1]["params"] == [1]
    with pytest.raises(bp.Error, match="unknown option 'amsgrad'"):
        bp.optim.AdamW([{"params": [a], "amsgrad": 1}])


def test_schedulers_follow_pytorch_landmarks(rng):
    w = bp.tensor(f32(rng, 4), requires_grad=True)
    opt = bp.optim.AdamW([w], lr=1e-3)
    s = lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=100)
    assert opt.lr == pytest.approx(0.004) and opt.param_groups[0]["betas"][0] == pytest.approx(0.95)
    for _ in range(29):
        s.step()
    assert opt.lr == pytest.approx(0.1) and opt.param_groups[0]["betas"][0] == pytest.approx(0.85)
    sgd = bp.optim.SGD([w], lr=0.5)
    step = lr_scheduler.StepLR(sgd, step_size=2, gamma=0.5)
    lrs = []
    for _ in range(5):
        lrs.append(sgd.lr)
        step.step()
    assert lrs == [0.5, 0.5, 0.25, 0.25, 0.125]
    lam = lr_scheduler.LambdaLR(sgd, lambda e: 1.0 / (e + 1))
    lam.step()
    assert sgd.lr == pytest.approx(0.125 / 2)
    with pytest.raises(bp.Error, match="anneal_strategy 'x'"):
        lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10, anneal_strategy="x")


def _run(device, seed):
    bp.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3)).to(device)
    opt = bp.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=0.05)
    sched = lr_scheduler.get_cosine_schedule_with_warmup(opt, 3, 20)
    return model, opt, sched


def _step(model, opt, sched, device, k):
    g = np.random.default_rng(1000 + k)
    x = bp.tensor(g.standard_normal((8, 6)).astype(np.float32), device=device)
    y = bp.tensor(g.standard_normal((8, 3)).astype(np.float32), device=device)
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    sched.step()
    return loss.item()


def test_a_resumed_run_repeats_the_losses_exactly(device, tmp_path):
    path = tmp_path / "run.ckpt"
    run = _run(device, 7)
    whole = [_step(*run, device, k) for k in range(10)]
    run = _run(device, 7)
    first = [_step(*run, device, k) for k in range(5)]
    bp.save_checkpoint(path, run[0], run[1], run[2], step=5, metadata={"note": "half"})
    run = _run(device, 99)
    bp.manual_seed(4321)
    step, meta = bp.load_checkpoint(path, *run)
    assert step == 5 and meta == {"note": "half"}
    rest = [_step(*run, device, k) for k in range(5, 10)]
    assert first + rest == whole


def test_a_checkpoint_of_another_model_is_refused(device, tmp_path):
    path = tmp_path / "run.ckpt"
    model, opt, sched = _run(device, 1)
    bp.save_checkpoint(path, model, opt, sched)
    other = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 4)).to(device)
    before = other[0].weight.numpy().copy()
    oopt = bp.optim.AdamW(other.parameters())
    osched = lr_scheduler.get_cosine_schedule_with_warmup(oopt, 3, 20)
    with pytest.raises(bp.ShapeError, match="'3.bias' has shape"):
        bp.load_checkpoint(path, other, oopt, osched)
    np.testing.assert_array_equal(other[0].weight.numpy(), before)
