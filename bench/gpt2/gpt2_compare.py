#!/usr/bin/env python3
"""GPT-2 small (124M) on Backplane against the same model in PyTorch, in one command:

1. logits: PyTorch builds GPT-2 (nanoGPT's module, below, with GPT-2's tanh GELU), saves its
   weights with safetensors; Backplane's GPT (backplane.models.GPT, gelu_approximate="tanh")
   loads the file and both compute the f32 logits of one random token batch. The measure is
   max |bp - torch| / max |torch| over every logit; it passes below 1e-4.
2. one training step: bf16 autocast forward, cross-entropy, backward and AdamW (lr 6e-4,
   betas (0.9, 0.95), weight decay 0.1) from the same weights and batch on both; the loss of the
   step and the loss after it (same batch, autocast, no grad) must agree within 1e-2.
3. with --bench (GPU devices; --bench-cpu adds cpu ones): training throughput in tokens/s at batch 8 x 1024 (--batch, --seq), AdamW,
   for PyTorch eager bf16 autocast, torch.compile (bf16 autocast), PyTorch f32, Backplane eager
   bf16 autocast, Backplane with zero_grad + forward + backward captured in a backplane.Graph
   (replayed, then the optimiser step; Adam's bias correction reads the step count on the host,
   so the step itself is not in the graph) and Backplane f32. Each figure is the median of
   --windows timed windows of --steps steps, after --warmup steps; each window ends with a
   device synchronisation. TF32 is off on both sides (f32 means f32).

The weights are nanoGPT's initialisation (N(0, 0.02), residual projections 0.02 / sqrt(2 L))
with every bias and LayerNorm parameter perturbed (N(0, 0.02) biases, 1 + N(0, 0.1) LayerNorm
weights), so that no parameter is a trivial 0 or 1 and every one of them is compared.

State-dict keys: Backplane's GPT has nanoGPT's keys (transformer.wte.weight,
transformer.h.<i>.attn.c_attn.weight, ...). nanoGPT's lm_head.weight is the tied token
embedding: it is not written (safetensors refuses shared tensors, and Backplane's head is tied).
Hugging Face's GPT2LMHeadModel has the same names under transformer. but stores the four
projections (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) as Conv1D weights [in, out]:
transpose those four to load one (Backplane's Linear is [out, in], as torch.nn.Linear).

    python3 bench/gpt2/gpt2_compare.py --device cpu:0 --smoke     # tiny model, seconds
    python3 bench/gpt2/gpt2_compare.py --config char --device cpu:0 --bench --bench-cpu \
        --no-compile --batch 8                                     # the character GPT on a CPU
    python3 bench/gpt2/gpt2_compare.py --device cuda:0 --bench --json out/gpt2.json \\
        --markdown out/gpt2.md

Exit status 1 when a comparison fails its tolerance. --smoke uses a tiny configuration (2
layers, 2 heads, 64 wide, context 64, vocabulary 512) for CI.
"""
import argparse
import datetime
import json
import math
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time

LOGIT_TOL = 1e-4  # max |diff| / max |ref| of the f32 logits
LOSS_TOL = 1e-2   # |loss_bp - loss_torch| of the bf16 autocast step

GPT2_SMALL = dict(block_size=1024, vocab_size=50257, n_layer=12, n_head=12, n_embd=768)
SMOKE = dict(block_size=64, vocab_size=512, n_layer=2, n_head=2, n_embd=64)
# The character GPT of examples/gpt and examples/python/gpt_chars.py (issue 27's CPU row): its
# vocabulary is the bytes of /usr/share/common-licenses, 96 of them.
CHAR = dict(block_size=256, vocab_size=96, n_layer=6, n_head=6, n_embd=384)
CONFIGS = {"gpt2": GPT2_SMALL, "char": CHAR, "smoke": SMOKE}
TITLES = {"gpt2": "GPT-2 small (124M)", "char": "the character GPT (10.7M)", "smoke": "GPT-2 smoke"}
ADAMW = dict(lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


# ---- PyTorch's model (nanoGPT's model.py with GPT-2's tanh GELU) ------------------------------

def torch_gpt(torch, cfg):
    """A torch.nn.Module whose state_dict keys are Backplane GPT's (plus the tied lm_head)."""
    nn, F = torch.nn, torch.nn.functional
    C, H, L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]

    class CausalSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(C, 3 * C)
            self.c_proj = nn.Linear(C, C)

        def forward(self, x):
            B, T, _ = x.size()
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2)
                       for t in self.c_attn(x).split(C, dim=2))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(C, 4 * C)
            self.c_proj = nn.Linear(4 * C, C)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn = nn.LayerNorm(C), CausalSelfAttention()
            self.ln_2, self.mlp = nn.LayerNorm(C), MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(cfg["vocab_size"], C), wpe=nn.Embedding(cfg["block_size"], C),
                h=nn.ModuleList([Block() for _ in range(L)]), ln_f=nn.LayerNorm(C)))
            self.lm_head = nn.Linear(C, cfg["vocab_size"], bias=False)
            self.lm_head.weight = self.transformer.wte.weight  # tied, as GPT-2
            with torch.no_grad():
                for name, p in self.named_parameters():
                    if name.endswith("c_proj.weight"):
                        p.normal_(0.0, 0.02 / math.sqrt(2 * L))
                    elif name.endswith(".weight") and ".ln_" not in name:
                        p.normal_(0.0, 0.02)
                    elif ".ln_" in name and name.endswith(".weight"):
                        p.copy_(1.0 + 0.1 * torch.randn_like(p))
                    else:  # biases (Linear and LayerNorm)
                        p.normal_(0.0, 0.02)

        def forward(self, idx):
            t = self.transformer
            pos = torch.arange(idx.size(1), device=idx.device)
            x = t.wte(idx) + t.wpe(pos)
            for block in t.h:
                x = block(x)
            return self.lm_head(t.ln_f(x))

    return GPT()


def torch_device(torch, name):
    return torch.device(name.replace("cpu:0", "cpu"))


def save_torch_weights(torch, model, path):
    from safetensors.torch import save_file

    sd = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()
          if k != "lm_head.weight"}
    save_file(sd, path)


# ---- Backplane's model --------------------------------------------------------------------------

def bp_gpt(bp, cfg, device, path):
    """backplane.models.GPT with GPT-2's GELU, its weights loaded from the safetensors file."""
    model = bp.models.GPT(bp.models.GPTConfig(**cfg, gelu_approximate="tanh"), device=device)
    model.load_state_dict(bp.load(path, map_location=device))
    return model


def to_numpy(bp_tensor):
    import numpy as np

    return np.asarray(bp_tensor.to("cpu:0").numpy(), dtype=np.float64)


# ---- 1 and 2: the comparisons ------------------------------------------------------------------

def compare(device, cfg, batch, seq, seed, fused=True, log=print):
    """Logits and one bf16 autocast AdamW step of both libraries on `device` (a string such as
    "cpu:0"; Backplane's AdamW with `fused`). Returns a dict of the measures and whether each
    passed."""
    import numpy as np
    import torch

    import backplane as bp

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    bp.set_allow_tf32(False)
    tdev, dev = torch_device(torch, device), bp.device(device)
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    tokens = rng.integers(0, cfg["vocab_size"], size=(batch, seq), dtype=np.int64)
    targets = rng.integers(0, cfg["vocab_size"], size=(batch, seq), dtype=np.int64)
    tmodel = torch_gpt(torch, cfg).to(tdev)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "gpt2.safetensors")
        save_torch_weights(torch, tmodel, path)
        model = bp_gpt(bp, cfg, dev, path)
    tx, ty = torch.from_numpy(tokens).to(tdev), torch.from_numpy(targets).to(tdev)
    x, y = bp.from_numpy(tokens).to(dev), bp.from_numpy(targets).to(dev)

    with torch.no_grad():
        ref = tmodel(tx).double().cpu().numpy()
    with bp.no_grad():
        out = to_numpy(model(x))
    logit_err = float(np.abs(out - ref).max() / np.abs(ref).max())
    res = {"device": device, "batch": batch, "seq": seq, "seed": seed,
           "logits_max_abs_diff_over_max_abs_ref": logit_err,
           "logits_ok": bool(logit_err <= LOGIT_TOL)}
    log(f"{device}: f32 logits [{batch}, {seq}, {cfg['vocab_size']}]: max |bp - torch| / "
        f"max |torch| = {logit_err:.3e} (tolerance {LOGIT_TOL:g})")

    V = cfg["vocab_size"]
    topt = torch.optim.AdamW(tmodel.parameters(), **ADAMW)
    opt = bp.optim.AdamW(model.parameters(), **ADAMW, fused=fused)
    with torch.autocast(tdev.type, dtype=torch.bfloat16):
        tloss = torch.nn.functional.cross_entropy(tmodel(tx).view(-1, V), ty.view(-1))
    tloss.backward()
    topt.step()
    with bp.autocast(dev.type, dtype=bp.bfloat16):
        loss = bp.nn.functional.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
    loss.backward()
    opt.step()
    with torch.no_grad(), torch.autocast(tdev.type, dtype=torch.bfloat16):
        tafter = torch.nn.functional.cross_entropy(tmodel(tx).view(-1, V), ty.view(-1))
    with bp.no_grad(), bp.autocast(dev.type, dtype=bp.bfloat16):
        after = bp.nn.functional.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
    step = (float(loss.item()), float(tloss.item()))
    next_ = (float(after.item()), float(tafter.item()))
    res.update({"loss_bp": step[0], "loss_torch": step[1], "loss_after_step_bp": next_[0],
                "loss_after_step_torch": next_[1],
                "loss_ok": bool(abs(step[0] - step[1]) <= LOSS_TOL and
                                abs(next_[0] - next_[1]) <= LOSS_TOL)})
    log(f"{device}: bf16 autocast AdamW step: loss {step[0]:.5f} (torch {step[1]:.5f}), after the "
        f"step {next_[0]:.5f} (torch {next_[1]:.5f}); tolerance {LOSS_TOL:g}")
    return res


# ---- 3: throughput -----------------------------------------------------------------------------

def timed_windows(step, sync, tokens_per_step, warmup, steps, windows):
    for _ in range(warmup):
        step()
    sync()
    rates = []
    for _ in range(windows):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        rates.append(tokens_per_step * steps / (time.perf_counter() - t0))
    return {"median": statistics.median(rates), "min": min(rates), "max": max(rates)}


def bench_torch(device, cfg, batch, seq, a, mode):
    import torch

    tdev = torch_device(torch, device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    model = torch_gpt(torch, cfg).to(tdev)
    run = torch.compile(model) if mode == "compile" else model
    fused = {"fused": True} if tdev.type == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), **ADAMW, **fused)
    x = torch.randint(0, cfg["vocab_size"], (batch, seq), device=tdev)
    y = torch.randint(0, cfg["vocab_size"], (batch, seq), device=tdev)
    V = cfg["vocab_size"]
    amp = mode != "f32"

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(tdev.type, dtype=torch.bfloat16, enabled=amp):
            loss = torch.nn.functional.cross_entropy(run(x).view(-1, V), y.view(-1))
        loss.backward()
        opt.step()

    sync = torch.cuda.synchronize if tdev.type == "cuda" else (lambda: None)
    r = timed_windows(step, sync, batch * seq, a.warmup, a.steps, a.windows)
    del model, run, opt
    if tdev.type == "cuda":
        torch.cuda.empty_cache()
    return r


def bench_bp(device, cfg, batch, seq, a, mode):
    import numpy as np

    import backplane as bp

    dev = bp.device(device)
    bp.set_allow_tf32(False)
    bp.manual_seed(0)
    model = bp.models.GPT(bp.models.GPTConfig(**cfg, gelu_approximate="tanh"), device=dev)
    opt = bp.optim.AdamW(model.parameters(), **ADAMW, **({"fused": True} if a.fused else {}))
    rng = np.random.default_rng(0)
    x, y = (bp.from_numpy(rng.integers(0, cfg["vocab_size"], size=(batch, seq), dtype=np.int64))
            .to(dev) for _ in range(2))
    V = cfg["vocab_size"]
    amp = mode != "f32"

    def forward_backward():
        opt.zero_grad()
        with bp.autocast(dev.type, dtype=bp.bfloat16, enabled=amp):
            loss = bp.nn.functional.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
        loss.backward()

    def step():
        forward_backward()
        opt.step()

    if mode == "graph":
        for _ in range(max(a.warmup, 1)):
            step()
        g = bp.capture(forward_backward, dev)

        def step():  # noqa: F811 (the replayed form)
            g.replay()
            opt.step()

    r = timed_windows(step, lambda: bp.synchronize(dev), batch * seq, a.warmup, a.steps,
                      a.windows)
    del model, opt
    bp.empty_cache(dev)
    return r


RUNS = [("PyTorch eager, bf16 autocast", bench_torch, "amp"),
        ("PyTorch torch.compile, bf16 autocast", bench_torch, "compile"),
        ("PyTorch eager, f32", bench_torch, "f32"),
        ("Backplane eager, bf16 autocast", bench_bp, "amp"),
        ("Backplane graph replay, bf16 autocast", bench_bp, "graph"),
        ("Backplane eager, f32", bench_bp, "f32")]


def throughput(device, cfg, a, log=print):
    rows = []
    for label, fn, mode in RUNS:
        if mode == "compile" and not a.compile:
            continue
        try:
            r = fn(device, cfg, a.batch, a.seq, a, mode)
        except Exception as e:  # a failing configuration is reported, the others still run
            log(f"{device}: {label}: FAILED: {type(e).__name__}: {e}")
            rows.append({"device": device, "run": label, "error": f"{type(e).__name__}: {e}"})
            continue
        log(f"{device}: {label}: {r['median'] / 1e3:.1f}k tokens/s (min {r['min'] / 1e3:.1f}k, "
            f"max {r['max'] / 1e3:.1f}k)")
        rows.append({"device": device, "run": label, "tokens_per_s": r["median"],
                     "min": r["min"], "max": r["max"]})
    return rows


def bench_rows(rows):
    """The throughput rows as table cells, each with its ratio to PyTorch eager bf16 on its
    device."""
    base = {r["device"]: r["tokens_per_s"] for r in rows
            if r["run"] == RUNS[0][0] and "tokens_per_s" in r}
    out = []
    for r in rows:
        if "error" in r:
            out.append([r["device"], r["run"], "failed: " + r["error"], "", ""])
            continue
        ratio = f"{r['tokens_per_s'] / base[r['device']]:.2f}x" if r["device"] in base else ""
        out.append([r["device"], r["run"], f"{r['tokens_per_s'] / 1e3:.1f}k",
                    f"{r['min'] / 1e3:.1f}k - {r['max'] / 1e3:.1f}k", ratio])
    return out


def markdown(header, comparisons, rows):
    out = [header, ""]
    if comparisons:
        out += ["| device | logits max\\|diff\\|/max\\|ref\\| | loss bp / torch | "
                "after step bp / torch |", "| --- | --- | --- | --- |"]
        for c in comparisons:
            out.append(f"| {c['device']} | {c['logits_max_abs_diff_over_max_abs_ref']:.2e} | "
                       f"{c['loss_bp']:.4f} / {c['loss_torch']:.4f} | "
                       f"{c['loss_after_step_bp']:.4f} / {c['loss_after_step_torch']:.4f} |")
        out.append("")
    if rows:
        out += ["| device | run | tokens/s (median) | min - max | vs PyTorch eager bf16 |",
                "| --- | --- | --- | --- | --- |"]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |"
                for r in bench_rows(rows)]
    return "\n".join(out) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", action="append", default=[], help="cpu:0 (default), cuda:0, ...")
    p.add_argument("--smoke", action="store_true", help="tiny configuration (CI): --config smoke")
    p.add_argument("--config", choices=sorted(CONFIGS), default="gpt2",
                   help="gpt2 (GPT-2 small, the default), char (the character GPT: 6 layers, 6 "
                   "heads, 384 wide, context 256) or smoke")
    p.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(4), "little"))
    p.add_argument("--cmp-batch", type=int, default=2, help="batch of the comparisons")
    p.add_argument("--cmp-seq", type=int, default=0, help="sequence of the comparisons "
                   "(default: the context)")
    p.add_argument("--bench", action="store_true", help="measure training throughput")
    p.add_argument("--bench-cpu", action="store_true", help="--bench on cpu devices too "
                   "(GPT-2 small trains at a few hundred tokens/s there)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=0, help="default: the context (1024)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=10, help="steps per timed window")
    p.add_argument("--windows", type=int, default=5)
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--no-fused", dest="fused", action="store_false",
                   help="Backplane's AdamW without fused=True (comparison and throughput)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--markdown", help="write the table here")
    a = p.parse_args(argv)
    if a.smoke:
        a.config = "smoke"
    cfg = dict(CONFIGS[a.config])
    a.seq = a.seq or cfg["block_size"]
    seq = a.cmp_seq or cfg["block_size"]
    devices = a.device or ["cpu:0"]

    import torch

    command = " ".join(shlex.quote(x) for x in
                       ["python3", os.path.relpath(__file__)] + (argv or sys.argv[1:]))
    now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    gpus = {torch.cuda.get_device_name(0)} if torch.cuda.is_available() else set()
    machine = f"{platform.node()} ({', '.join(sorted(gpus)) or 'no GPU'}), PyTorch " \
              f"{torch.__version__}"
    header = f"# {now} on {machine}: {command} (seed {a.seed})"
    print(header)
    comparisons, rows = [], []
    for d in devices:
        comparisons.append(compare(d, cfg, a.cmp_batch, seq, a.seed, a.fused))
        if a.bench and (a.bench_cpu or not d.startswith("cpu")):
            rows += throughput(d, cfg, a)
    ok = all(c["logits_ok"] and c["loss_ok"] for c in comparisons)
    if a.json:  # a docs/bench-data file as it is (title ... rows), plus the raw results
        with open(a.json, "w") as f:
            json.dump({"title": f"{TITLES[a.config]} training "
                                f"against PyTorch, batch {a.batch} x {a.seq}, AdamW",
                       "date": now, "machine": machine, "command": command,
                       "columns": ["device", "run", "tokens/s (median)", "min - max",
                                   "vs PyTorch eager bf16"],
                       "rows": bench_rows(rows), "config": cfg, "comparisons": comparisons,
                       "throughput": rows}, f, indent=1)
    table = markdown(header, comparisons, rows)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(table)
    print(table)
    print("PASS" if ok else "FAIL: a comparison is outside its tolerance")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
