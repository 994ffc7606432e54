"""A plain TensorFlow 2 ParameterServerStrategy program: nothing in it knows kubetrain.

It reads only TF_CONFIG, as under a Kubeflow TFJob: `ps` and `worker` tasks start a
tf.distribute.Server and serve until they are stopped; the `chief` is the coordinator: it
places a small Keras model's variables on the PS tasks (partitioned), trains it with
Model.fit (Keras 2: TF_USE_LEGACY_KERAS=1 with the tf-keras package), the workers reading
Fashion-MNIST's IDX files themselves, then evaluates on the test set and exits 0.

Environment: DATA_DIR (default /data), EPOCHS, STEPS_PER_EPOCH, BATCH (defaults 3, 200, 64).
Run as in examples/tensorflow/ps-strategy.yaml; `make tf-compat-test` runs it end to end.
"""
import gzip
import os
import sys

import numpy as np
import tensorflow as tf

DATA = os.environ.get("DATA_DIR", "/data")
EPOCHS = int(os.environ.get("EPOCHS", "3"))
STEPS_PER_EPOCH = int(os.environ.get("STEPS_PER_EPOCH", "200"))
BATCH = int(os.environ.get("BATCH", "64"))

resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
if resolver.task_type in ("ps", "worker"):
    print(f"{resolver.task_type}:{resolver.task_id} serving", flush=True)
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                  task_index=resolver.task_id, protocol=resolver.rpc_layer or "grpc",
                                  start=True)
    server.join()
    sys.exit(0)

# The chief: the coordinator.
print(f"chief: cluster {resolver.cluster_spec().as_dict()}", flush=True)
strategy = tf.distribute.ParameterServerStrategy(
    resolver,
    variable_partitioner=tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=64 << 10, max_shards=len(resolver.cluster_spec().as_dict()["ps"])))


def idx_dataset(kind):
    """Images and labels from the IDX files, read where the dataset runs (on the workers)."""
    images = tf.data.FixedLengthRecordDataset(f"{DATA}/{kind}-images-idx3-ubyte.gz", 784,
                                              header_bytes=16, compression_type="GZIP")
    labels = tf.data.FixedLengthRecordDataset(f"{DATA}/{kind}-labels-idx1-ubyte.gz", 1,
                                              header_bytes=8, compression_type="GZIP")
    decode = lambda raw, dtype: tf.io.decode_raw(raw, tf.uint8)
    return tf.data.Dataset.zip((images.map(lambda r: tf.cast(decode(r, tf.uint8), tf.float32) / 255.0),
                                labels.map(lambda r: tf.cast(decode(r, tf.uint8)[0], tf.int64))))


def dataset_fn(input_context):
    ds = idx_dataset("train").shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.shuffle(10000).repeat().batch(BATCH).prefetch(2)


with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Input((784,)),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], steps_per_execution=10)
print("chief: variables on " + ", ".join(sorted({v.device for v in model.variables})), flush=True)
model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn), epochs=EPOCHS,
          steps_per_epoch=STEPS_PER_EPOCH, verbose=2)


def read_idx(path, offset):
    with gzip.open(path) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


x = read_idx(f"{DATA}/t10k-images-idx3-ubyte.gz", 16).reshape(-1, 784).astype(np.float32) / 255.0
y = read_idx(f"{DATA}/t10k-labels-idx1-ubyte.gz", 8)
logits = np.concatenate([model(x[i:i + 1000], training=False).numpy() for i in range(0, len(x), 1000)])
accuracy = float(np.mean(np.argmax(logits, axis=1) == y))
print(f"chief: test accuracy {accuracy:.4f} on {len(y)} examples", flush=True)
