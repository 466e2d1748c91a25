"""Writes scikit-learn's handwritten digits (sklearn.datasets.load_digits: 1,797 8x8 images of
the values 0..16, ten classes) as a safetensors file that the C++ and Python LeNet examples
read, split once into a training and a test set:

    x_train u8 [1437, 8, 8]   y_train i64 [1437]
    x_test  u8 [360, 8, 8]    y_test  i64 [360]

The split is a fixed permutation (NumPy's default_rng(0)), so every run and every language
sees the same sets. Needs numpy, scikit-learn and safetensors.

    python examples/python/export_digits.py tests/fixtures/digits/digits.safetensors
"""
import sys

import numpy as np
from safetensors.numpy import save_file
from sklearn.datasets import load_digits


def main(path):
    digits = load_digits()
    images = digits.images.astype(np.uint8)  # 0..16
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(labels))
    n_test = 360
    test, train = order[:n_test], order[n_test:]
    save_file({"x_train": np.ascontiguousarray(images[train]), "y_train": labels[train],
               "x_test": np.ascontiguousarray(images[test]), "y_test": labels[test]}, path,
              metadata={"source": "sklearn.datasets.load_digits", "split": "default_rng(0)"})
    print(f"wrote {path}: {len(train)} training and {n_test} test images")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "digits.safetensors")
