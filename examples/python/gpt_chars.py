"""A character-level GPT (backplane.models.GPT, nanoGPT's model) trained on the GNU licence
texts under /usr/share/common-licenses: the Python twin of examples/gpt (the same corpus,
vocabulary and split; batches drawn with Python's random, so not the C++ example's).

    python3 examples/python/gpt_chars.py [--device cpu:0] [--layers 2] [--width 64] ...
"""
import argparse
import math
import os
import random

import backplane as bp
from backplane.nn import functional as F


def corpus(path):
    text = b""
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if os.path.isfile(full):
            with open(full, "rb") as f:
                text += f.read()
    return text


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="/usr/share/common-licenses")
    p.add_argument("--device", default="cpu:0")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=100)
    a = p.parse_args()

    text = corpus(a.data)
    vocab = sorted(set(text))
    stoi = {c: i for i, c in enumerate(vocab)}
    tokens = [stoi[c] for c in text]
    cut = len(tokens) * 9 // 10
    train, val = tokens[:cut], tokens[cut:]
    dev = bp.device(a.device)
    cfg = bp.models.GPTConfig(block_size=a.context, vocab_size=len(vocab), n_layer=a.layers,
                              n_head=a.heads, n_embd=a.width, dropout=0.0)
    bp.manual_seed(a.seed)
    model = bp.models.GPT(cfg, device=dev)
    print(f"{model.num_params()} parameters, vocabulary {len(vocab)}, "
          f"{len(train)} training and {len(val)} validation bytes, on {dev}")
    opt = bp.optim.Adam(model.parameters(), lr=a.lr)
    rng = random.Random(a.seed)

    def draw(data, r):
        xs, ys = [], []
        for _ in range(a.batch):
            o = r.randrange(0, len(data) - a.context - 1)
            xs.append(data[o:o + a.context])
            ys.append(data[o + 1:o + 1 + a.context])
        return bp.tensor(xs, device=dev), bp.tensor(ys, device=dev)

    def loss_of(x, y):
        return F.cross_entropy(model(x).reshape(-1, len(vocab)), y.reshape(-1))

    total = 0.0
    for step in range(1, a.steps + 1):
        x, y = draw(train, rng)
        loss = loss_of(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        total += loss.item()
        if step % a.eval_every == 0 or step == a.steps:
            model.eval()
            vr = random.Random(a.seed + 1)
            with bp.no_grad():
                v = sum(loss_of(*draw(val, vr)).item() for _ in range(8)) / 8
            model.train()
            print(f"step {step}: train loss {total / a.eval_every:.4f}, val loss {v:.4f} "
                  f"(uniform: {math.log(len(vocab)):.2f})")
            total = 0.0


if __name__ == "__main__":
    main()
