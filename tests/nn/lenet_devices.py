"""Runs example-lenet with one seed on each given device and checks that every run reaches the
accuracy floor and that the accuracies agree within 1 point (the same Philox initialisation and
the same batch order on every device).

    python3 tests/nn/lenet_devices.py --binary build/bin/example-lenet \
        --data tests/fixtures/digits/digits.safetensors --devices cpu:0,opencl:0
"""
import argparse
import json
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--devices", default="cpu:0")
    ap.add_argument("--min-accuracy", type=float, default=0.95)
    ap.add_argument("--max-spread", type=float, default=0.01)
    ap.add_argument("extra", nargs="*", help="further arguments for the binary")
    args = ap.parse_args()
    acc = {}
    for dev in args.devices.split(","):
        out = subprocess.run([args.binary, "--data", args.data, "--device", dev,
                              "--min-accuracy", str(args.min_accuracy), *args.extra],
                             capture_output=True, text=True)
        sys.stdout.write(out.stdout)
        sys.stderr.write(out.stderr)
        if out.returncode != 0:
            print(f"FAIL: example-lenet on {dev} exited {out.returncode}")
            return 1
        line = [l for l in out.stdout.splitlines() if l.startswith("{")][-1]
        acc[dev] = json.loads(line)["test_accuracy"]
    spread = max(acc.values()) - min(acc.values())
    print(f"test accuracy per device: {acc}; spread {spread:.4f}")
    if spread > args.max_spread:
        print(f"FAIL: the accuracies differ by {spread:.4f} > {args.max_spread}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
