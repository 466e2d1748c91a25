"""LeNet-5 (Dive into Deep Learning, "Convolutional Neural Networks (LeNet)") trained on
scikit-learn's handwritten digits, in Backplane with PyTorch's names. The data comes from
sklearn.datasets.load_digits through examples/python/export_digits.py's file (the C++
example examples/lenet reads the same file), or from scikit-learn directly with --sklearn.

    python examples/python/lenet_digits.py [--device cpu:0] [--epochs 40] [--activation relu]
        [--data tests/fixtures/digits/digits.safetensors] [--sklearn]

Prints the loss of every epoch and the test accuracy.
"""
import argparse
import os
import tempfile

import numpy as np

import backplane as bp
from backplane.nn import functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


def load(args):
    path = args.data
    if args.sklearn:
        import export_digits  # noqa: E402  (beside this file)

        path = os.path.join(tempfile.mkdtemp(), "digits.safetensors")
        export_digits.main(path)
    data = bp.load(path, map_location="cpu")
    return (bp.models.digits_images(data["x_train"]), data["y_train"],
            bp.models.digits_images(data["x_test"]), data["y_test"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu:0")
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--activation", default="relu", choices=["relu", "sigmoid"])
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default=os.path.join(HERE, "..", "..", "tests", "fixtures",
                                                   "digits", "digits.safetensors"))
    ap.add_argument("--sklearn", action="store_true", help="export the data from scikit-learn")
    args = ap.parse_args()
    dev = bp.device(args.device)
    xtr, ytr, xte, yte = load(args)
    xte, yte = xte.to(dev), yte.to(dev)
    bp.manual_seed(args.seed)
    net = bp.models.LeNet(args.activation, device=dev)
    print(net)
    opt = bp.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    order = np.random.default_rng(args.seed)
    n = xtr.shape[0]
    for epoch in range(args.epochs):
        perm, total, batches = order.permutation(n), 0.0, 0
        for s in range(0, n, args.batch):
            idx = bp.tensor(perm[s:s + args.batch], dtype=bp.int64)
            xb = bp.gather(xtr, 0, idx.reshape(-1, 1, 1, 1).expand(idx.shape[0], 1, 16, 16))
            yb = bp.gather(ytr, 0, idx)
            opt.zero_grad()
            loss = F.cross_entropy(net(xb.to(dev)), yb.to(dev))
            loss.backward()
            opt.step()
            total, batches = total + loss.item(), batches + 1
        print(f"epoch {epoch + 1:2d}  loss {total / batches:.4f}")
    net.eval()
    with bp.no_grad():
        acc = (net(xte).argmax(1) == yte).to(bp.float32).mean().item()
    print(f"test accuracy on {dev}: {acc:.4f}")
    return acc


if __name__ == "__main__":
    main()
