"""One task of TensorFlow 2's ParameterServerStrategy training (a custom training loop with a
ClusterCoordinator), the second TensorFlow API tests/bench/tf_peer compares with. Started by
tf_peer.py, one process per task (chief = the coordinator, PS, workers), with the JSON plan.

ParameterServerStrategy trains asynchronously only: each scheduled step applies its own gradient
on the PS. So only async jobs map to it. The coordinator schedules the steps, each with its batch as
an argument (the bytes of 64 images and their labels, 50 KB a step; turned into kubetrain's float
inputs on the worker): the k-th step gets the next batch of worker k mod W's kubetrain order, and
runs on whichever worker is free, so the batches are kubetrain's, interleaved by schedule order.

The chief prints `tf_peer_result {json}` as tf_peer_compat_v1.py does: its training phase runs from
the first scheduled step to the end of the final evaluation."""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # the Keras 2 optimizers work with this strategy
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tf_peer_data  # noqa: E402
import tf_peer_replica  # noqa: E402


def create_variables(strategy, model, seed):
    """The MLP's variables, kubetrain's initial values, placed as kubetrain places them: the
    largest kernel alone on PS 0, everything else on PS 1 (the strategy would go round-robin)."""
    sizes = [model["input_dim"]] + model["hidden_units"] + [model["num_classes"]]
    shapes = list(zip(sizes, sizes[1:]))
    initial = [tf_peer_replica.initial_kernel(f"dense{i}/kernel", rows, cols, seed)
               for i, (rows, cols) in enumerate(shapes)]
    with strategy.scope():
        kernels = [tf.Variable(initial[0], name="dense0/kernel")]
        kernels.append(tf.Variable(initial[1], name="dense1/kernel"))  # round-robin: PS 1
        with strategy.extended.colocate_vars_with(kernels[1]):
            kernels += [tf.Variable(v, name=f"dense{i}/kernel") for i, v in enumerate(initial[2:], 2)]
            biases = [tf.Variable(tf.zeros([cols]), name=f"dense{i}/bias") for i, (_, cols) in enumerate(shapes)]
    return [v for pair in zip(kernels, biases) for v in pair]


def logits_of(variables, x):
    h = x
    layers = len(variables) // 2
    for i in range(layers):
        h = tf.matmul(h, variables[2 * i]) + variables[2 * i + 1]
        if i + 1 < layers:
            h = tf.nn.relu(h)
    return h


def run_chief(plan, cluster):
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    if plan["mode"] != "async":
        raise ValueError("ParameterServerStrategy trains asynchronously only")
    if plan["optimizer"]["type"] != "adam":
        raise ValueError(f"optimizer {plan['optimizer']['type']!r}: only adam is mapped")
    workers, batch, target = len(cluster["worker"]), plan["batch_size"], plan["target_steps"]

    train_images, train_labels = tf_peer_data.load_idx(plan["data"], "train")
    test_images, test_labels = tf_peer_data.load_idx(plan["data"], "t10k")
    test_x = tf_peer_data.pixels(test_images)
    orders = [tf_peer_replica.batch_order(len(train_labels), w, workers, plan["seed"],
                                          (target // workers + 1) * batch) for w in range(workers)]

    variables = create_variables(strategy, plan["model"], plan["seed"])
    print("tf_peer: placement " + json.dumps({v.name: v.device for v in variables}), flush=True)
    opt = plan["optimizer"]
    with strategy.scope():
        optimizer = tf_keras.optimizers.legacy.Adam(opt["learning_rate"], beta_1=opt["beta1"],
                                                    beta_2=opt["beta2"], epsilon=opt["epsilon"])

    def replica_step(image_bytes, labels):
        x = tf.cast(image_bytes, tf.float32) * tf_peer_data.INV_255
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=labels, logits=logits_of(variables, x)))
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    @tf.function(input_signature=[tf.TensorSpec([batch, plan["model"]["input_dim"]], tf.uint8),
                                  tf.TensorSpec([batch], tf.int32)])
    def train_step(image_bytes, labels):
        return strategy.run(replica_step, args=(image_bytes, labels))

    @tf.function
    def correct(x, labels):
        predicted = tf.argmax(logits_of(variables, x), 1, output_type=tf.int32)
        return tf.reduce_sum(tf.cast(tf.equal(predicted, labels), tf.int32))

    def accuracy():
        return int(correct(test_x, test_labels)) / len(test_labels)

    with strategy.scope():
        # Traced (and the optimizer's slots created, next to their variables) before the clock
        # starts, as compat_v1 builds its graph before its session.
        train_step.get_concrete_function()
    every = plan["eval_every_steps"]
    start = time.monotonic()
    for k in range(target):
        rows = orders[k % workers][(k // workers) * batch:(k // workers + 1) * batch]
        coordinator.schedule(train_step, args=(train_images[rows], train_labels[rows]))
        if every > 0 and (k + 1) % every == 0 and k + 1 < target:
            accuracy()  # while the scheduled steps go on, as kubetrain's chief evaluates
    coordinator.join()
    test_accuracy = accuracy()
    seconds = time.monotonic() - start
    result = {"examples": target * batch, "seconds": seconds, "global_step": target,
              "test_accuracy": test_accuracy, "optimizer_iterations": int(optimizer.iterations.numpy())}
    print("tf_peer_result " + json.dumps(result), flush=True)
    os._exit(0)  # the PS and worker tasks serve until the launcher stops them


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", required=True, help="the JSON plan written by tf_peer.py")
    parser.add_argument("--job", required=True, choices=["chief", "ps", "worker"])
    parser.add_argument("--task", type=int, required=True)
    args = parser.parse_args()
    plan = json.load(open(args.plan))
    if args.job == "chief":
        run_chief(plan, plan["cluster"])
    else:
        server = tf.distribute.Server(tf.train.ClusterSpec(plan["cluster"]), job_name=args.job,
                                      task_index=args.task, protocol="grpc", start=True)
        server.join()


if __name__ == "__main__":
    main()
