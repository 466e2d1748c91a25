"""backplane.utils.data, the Trainer, backplane.profiler and the optimisers' state_dict and
param_groups (issue 32's Python API for what C++ has)."""
import json

import numpy as np
import pytest

import backplane as bp
from backplane import nn
from backplane.utils.data import DataLoader, Dataset, TensorDataset
from conftest import DEVICES


def f32(rng, *shape):
    return rng.uniform(-2, 2, size=shape).astype(np.float32)


@pytest.mark.parametrize("workers", [0, 2])
def test_data_loader_batches_shuffles_and_prefetches(rng, workers):
    x = f32(rng, 10, 3)
    y = np.arange(10)
    ds = TensorDataset(bp.tensor(x), bp.tensor(y))
    assert len(ds) == 10 and ds[3][1].item() == 3
    loader = DataLoader(ds, batch_size=4, shuffle=False, num_workers=workers)
    batches = list(loader)
    assert len(loader) == 3 and [b[0].shape for b in batches] == [(4, 3), (4, 3), (2, 3)]
    np.testing.assert_array_equal(np.concatenate([b[0].numpy() for b in batches]), x)
    shuffled = DataLoader(ds, batch_size=3, shuffle=True, drop_last=True, seed=7,
                          num_workers=workers, pin_memory=True)
    epoch1 = [b[1].numpy() for b in shuffled]
    epoch2 = [b[1].numpy() for b in shuffled]
    assert len(epoch1) == 3 and all(len(b) == 3 for b in epoch1)
    seen = np.concatenate(epoch1)
    assert len(set(seen.tolist())) == 9
    for b in DataLoader(ds, batch_size=3, shuffle=True, seed=7):
        np.testing.assert_array_equal(b[0].numpy(), x[b[1].numpy()])
    assert any((a != b).any() for a, b in zip(epoch1, epoch2))  # a new order each epoch
    again = DataLoader(ds, batch_size=3, shuffle=True, drop_last=True, seed=7)
    np.testing.assert_array_equal(np.concatenate([b[1].numpy() for b in again]), seen)


def test_data_loader_over_a_map_style_dataset(rng):
    class Squares(Dataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return {"x": np.full(2, i, np.float32), "y": i * i}

    batches = list(DataLoader(Squares(), batch_size=2, num_workers=2))
    assert [b["y"].tolist() for b in batches] == [[0, 1], [4, 9], [16]]
    assert batches[1]["x"].tolist() == [[2.0, 2.0], [3.0, 3.0]]
    with pytest.raises(ValueError, match="batch_size"):
        DataLoader(Squares(), batch_size=0)
    with pytest.raises(bp.ShapeError, match="first dimensions differ"):
        TensorDataset(bp.ones(3), bp.ones(4))


@pytest.mark.parametrize("dev", DEVICES, ids=str)
def test_trainer_fits_a_linear_model(dev, rng):
    true_w = np.array([[2.0, -3.4]], np.float32)
    X = rng.normal(size=(256, 2)).astype(np.float32)
    Y = X @ true_w.T + 4.2
    loader = DataLoader(TensorDataset(bp.tensor(X), bp.tensor(Y)), batch_size=32, shuffle=True,
                        seed=1)
    net = nn.Sequential(nn.LazyLinear(1))
    trainer = bp.Trainer(max_epochs=20, device=dev)
    assert trainer.device is dev
    losses = trainer.fit(net, loader, loss=nn.MSELoss(),
                         optimizer=lambda ps: bp.optim.SGD(ps, lr=0.1))
    assert len(losses) == 20 and losses[-1] < 1e-4 < losses[0]
    np.testing.assert_allclose(net[0].weight.numpy(), true_w, atol=1e-2)
    np.testing.assert_allclose(net[0].bias.numpy(), [4.2], atol=1e-2)
    assert bp.Trainer(num_gpus=0).device is bp.device("cpu")


def test_profiler_records_ops_ranges_and_a_trace(tmp_path, rng):
    x = bp.tensor(f32(rng, 64, 64))
    with bp.profiler.profile() as prof:
        with bp.profiler.record_function("my_block"):
            y = (x @ x).relu().sum()
        y.item()
    rows = prof.key_averages()
    names = {r.key: r for r in rows}
    assert "matmul" in names and names["matmul"].count == 1
    assert "relu" in names and names["relu"].device_time_total >= 0
    table = rows.table(row_limit=5)
    assert "matmul" in table
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(path)
    trace = json.loads(path.read_text())
    assert any(e.get("name") == "my_block" for e in trace["traceEvents"])


@pytest.mark.parametrize("make", ["sgd", "adam"])
def test_optimiser_state_dict_and_param_groups(make, rng):
    def build():
        bp.manual_seed(3)
        net = nn.Linear(3, 2)
        opt = (bp.optim.SGD(net.parameters(), lr=0.1, momentum=0.9) if make == "sgd"
               else bp.optim.Adam(net.parameters(), lr=0.01))
        return net, opt

    x = bp.tensor(f32(rng, 4, 3))

    def step(net, opt):
        opt.zero_grad()
        (net(x) ** 2).sum().backward()
        opt.step()

    net, opt = build()
    groups = opt.param_groups
    assert len(groups) == 1 and len(groups[0]["params"]) == 2
    assert groups[0]["lr"] == pytest.approx(opt.lr)
    groups[0]["lr"] = 0.05
    assert opt.lr == pytest.approx(0.05)
    groups[0]["weight_decay"] = 0.0  # writes through, as in torch.optim
    assert opt.param_groups[0]["weight_decay"] == 0.0
    with pytest.raises(bp.UnsupportedError, match="'params' cannot be reassigned"):
        groups[0]["params"] = []
    with pytest.raises(bp.Error, match="option 'amsgrad' does not exist"):
        groups[0]["amsgrad"] = 1
    step(net, opt)
    sd = opt.state_dict()
    assert sorted(sd["state"]) == [0, 1] and sd["param_groups"][0]["params"] == [0, 1]
    key = "momentum_buffer" if make == "sgd" else "exp_avg"
    assert sd["state"][0][key].shape == (2, 3)
    # A fresh optimiser loaded from the state continues exactly like the original.
    net2, opt2 = build()
    net2.load_state_dict(net.state_dict())
    opt2.load_state_dict(sd)
    assert opt2.lr == pytest.approx(0.05)
    snapshot = {k: v.numpy().copy() for k, v in sd["state"][0].items()}
    step(net, opt)
    step(net2, opt2)
    np.testing.assert_allclose(net2.weight.numpy(), net.weight.numpy(), rtol=1e-6, atol=1e-7)
    assert snapshot  # the state held tensors
    bad = {"state": {0: {key: bp.zeros(5)}}, "param_groups": sd["param_groups"]}
    with pytest.raises(bp.ShapeError):
        opt2.load_state_dict(bad)
