"""The Fashion-MNIST IDX files as kubetrain reads them (core/dataset.cc), for the TensorFlow side
of tests/bench/tf_peer: images kept as bytes, turned into pixel * (1/255) in float32 per batch."""
import gzip
import os

import numpy as np

INV_255 = np.float32(1.0 / 255.0)  # kubetrain: pixels[i] * (1.0f / 255.0f)


def _idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def _find(directory, stem):
    for name in (stem + ".gz", stem):
        if os.path.exists(os.path.join(directory, name)):
            return os.path.join(directory, name)
    raise FileNotFoundError(f"{stem}(.gz) not in {directory}")


def load_idx(directory, split):
    """(images as uint8 [n, 784], labels as int32 [n]) of split "train" or "t10k"."""
    images = _idx(_find(directory, f"{split}-images-idx3-ubyte"))
    labels = _idx(_find(directory, f"{split}-labels-idx1-ubyte")).astype(np.int32)
    return images.reshape(len(images), -1), labels


def pixels(images, rows=None):
    """Rows of `images` (all without `rows`) as kubetrain's float32 inputs."""
    chosen = images if rows is None else images[rows]
    return chosen.astype(np.float32) * INV_255
