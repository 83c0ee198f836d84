#!/usr/bin/env python3
"""Writes tests/data/mini-fashion-mnist/: the first 256 training and 128 test examples of
Fashion-MNIST (MIT licence, Zalando Research), as gzip IDX files with the original names. Used by
test_data (a second gzip producer besides zlib's gzopen) and by the mnist_train smoke tests.

    python3 tests/data/make_mini_fashion_mnist.py [/usr/share/datasets/fashion-mnist]
"""
import gzip
import os
import struct
import sys

SRC = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/datasets/fashion-mnist"
DST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mini-fashion-mnist")
COUNTS = {"train": 256, "t10k": 128}


def subset(name, n):
    with gzip.open(os.path.join(SRC, name + ".gz"), "rb") as f:
        raw = f.read()
    rank = raw[3]
    dims = list(struct.unpack(">" + "I" * rank, raw[4:4 + 4 * rank]))
    per_item = 1
    for d in dims[1:]:
        per_item *= d
    dims[0] = n
    header = raw[:4] + struct.pack(">" + "I" * rank, *dims)
    body = raw[4 + 4 * rank:4 + 4 * rank + n * per_item]
    # mtime=0 keeps the files byte-for-byte reproducible.
    with gzip.GzipFile(os.path.join(DST, name + ".gz"), "wb", compresslevel=9, mtime=0) as g:
        g.write(header + body)


os.makedirs(DST, exist_ok=True)
for split, n in COUNTS.items():
    subset(split + "-images-idx3-ubyte", n)
    subset(split + "-labels-idx1-ubyte", n)


# Two broken copies for the mnist_train rejection tests (tiny, uncompressed IDX):
#   bad-count-mnist: 8 training images but 7 labels;  bad-size-mnist: 20x20 training images.
def write_idx(path, type_code, dims, payload):
    with open(path, "wb") as f:
        f.write(bytes([0, 0, type_code, len(dims)]) + struct.pack(">" + "I" * len(dims), *dims))
        f.write(bytes(payload))


for name, n_img, n_lab, side in (("bad-count-mnist", 8, 7, 28), ("bad-size-mnist", 4, 4, 20)):
    d = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    os.makedirs(d, exist_ok=True)
    for split in ("train", "t10k"):
        write_idx(os.path.join(d, split + "-images-idx3-ubyte"), 0x08, [n_img, side, side],
                  [(k * 7) % 256 for k in range(n_img * side * side)])
        write_idx(os.path.join(d, split + "-labels-idx1-ubyte"), 0x08, [n_lab],
                  [k % 10 for k in range(n_lab)])
