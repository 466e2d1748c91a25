"""The "GPUs" section of Dive into Deep Learning (d2l.ai, chapter "Builders' Guide"), with
backplane in place of torch / mxnet. Runs on any machine: with no GPU every try_gpu() is the
CPU, as in the book. The values the book prints are shown after "# book:".

    python examples/python/gpu_computing.py
"""
import os
import tempfile

import backplane as bp
from backplane import nn


def show(label, value):
    text = str(value)
    if "\n" in text:
        print(f"{label}:\n{text}")
    else:
        print(f"{label:<34} {text}")


# ---- Computing devices ----------------------------------------------------------------------
def cpu():
    return bp.device("cpu")


def gpu(i=0):
    return bp.device(f"cuda:{i}")


print("== devices")
show("cpu()", repr(cpu()))                      # book: device(type='cpu')
show("num_gpus()", bp.num_gpus())               # book: 2
show("try_gpu()", repr(bp.try_gpu()))           # book: device(type='cuda', index=0)
show("try_gpu(10)", repr(bp.try_gpu(10)))       # book: device(type='cpu')
show("try_all_gpus()", bp.try_all_gpus())       # book: [cuda:0, cuda:1]
show("is_available('cuda')", bp.is_available("cuda"))
for d in bp.devices():
    stats = d.memory_stats()
    show(f"  {d}", f"{d.name} ({d.backend}), {stats['allocated']} bytes allocated")

# ---- Tensors and GPUs -----------------------------------------------------------------------
print("\n== tensors and GPUs")
x = bp.tensor([1, 2, 3])
show("x.device", repr(x.device))                # book: device(type='cpu')
print("print(x):")
print(x)                                        # [1 2 3] <Tensor 3 i64 @cpu:0> (book: tensor([1, 2, 3]))

X = bp.ones(2, 3, device=bp.try_gpu())
show("X = ones(2, 3, device=try_gpu())", repr(X))
# book: tensor([[1., 1., 1.], [1., 1., 1.]], device='cuda:0')
bp.manual_seed(0)
Y = bp.rand(2, 3, device=bp.try_gpu(1))
show("Y = rand(2, 3, device=try_gpu(1))", repr(Y))

Z = X.to(bp.try_gpu(1))                         # book: Z = X.cuda(1)
show("Z = X.to(try_gpu(1))", repr(Z))
show("Y + Z", repr(Y + Z))                      # both on try_gpu(1)
show("Z.to(try_gpu(1)) is Z", Z.to(bp.try_gpu(1)) is Z)    # book: True

# The walkthrough's values (MXNet edition: copyto / as_in_context).
g = bp.try_gpu()
y = x.copy_to(g)
z = x.as_in_context(g)
show("y.copy_to(gpu) is y", y.copy_to(g) is y)  # book: False
show("z.as_in_context(gpu) is z", z.as_in_context(g) is z)  # book: True
print("(z + 2).exp() + y:")
print((z + 2).exp() + y)                        # book: [21.085537 56.59815 151.41316] @gpu(0)
print("(z + 2).exp() * y:")
print((z + 2).exp() * y)                        # book: [ 20.085537 109.1963 445.2395 ] @gpu(0)
print("y ** 2:")
print(y ** 2)                                   # book: [1. 4. 9.] @gpu(0)
if g.type != "cpu":
    try:
        x + y
    except bp.DeviceMismatch as e:              # never a silent copy
        show("x + y", f"DeviceMismatch: {e}")
show("(y ** 2).cpu().tolist()", (y ** 2).cpu().tolist())   # explicit, synchronises

# ---- Neural networks and GPUs ---------------------------------------------------------------
print("\n== neural networks and GPUs")
bp.manual_seed(0)
net = nn.Sequential(nn.LazyLinear(1))
net = net.to(bp.try_gpu())
out = net(X)
show("net(X)", repr(out))   # book: tensor([[v], [v]], device='cuda:0'): two equal rows
show("net[0].weight.device", repr(net[0].weight.device))  # book: device(type='cuda', index=0)

# Saving the parameters and loading them onto a chosen device (the next section of the book).
path = os.path.join(tempfile.mkdtemp(), "mlp.safetensors")
bp.save(net.state_dict(), path)
clone = nn.Sequential(nn.LazyLinear(1))
clone.load_state_dict(bp.load(path, map_location=bp.try_gpu()))
show("clone(X) == net(X)", bp.allclose(clone(X), out))     # book: tensor([[True], [True]])
show("memory_stats(try_gpu())", bp.memory_stats(bp.try_gpu()))
