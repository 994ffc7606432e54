"""One task (PS or worker) of TensorFlow's own parameter-server training, tf.compat.v1 style:
replica_device_setter + MonitoredTrainingSession, SyncReplicasOptimizer in sync mode. Started by
tests/bench/tf_peer.py, one process per task, with a JSON plan (--plan) that names the cluster and
the job's hyper-parameters as tf_peer.py mapped them from the kubetrain TrainingJob.

The chief (worker 0) prints one line `tf_peer_result {json}` with what the bench compares: the
examples trained, the seconds of its training phase (from its session being ready to the end of the
final evaluation, as kubetrain's chief counts from its training loop's start to its final
evaluation), and the test accuracy of the final model. Then it exits at once: the launcher stops
the PS tasks (which serve until killed) and, in sync mode, the other worker (which may wait forever
for a token of a step the chief will not run)."""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tf_peer_census_v1  # noqa: E402
import tf_peer_data  # noqa: E402
import tf_peer_replica  # noqa: E402

v1 = tf.compat.v1


def dense_variables(model, seed):
    """The MLP's variables with kubetrain's names and initial values (biases zero)."""
    sizes = [model["input_dim"]] + model["hidden_units"] + [model["num_classes"]]
    layers = []
    for i, (rows, cols) in enumerate(zip(sizes, sizes[1:])):
        name = f"dense{i}"
        kernel = tf_peer_replica.initial_kernel(f"{name}/kernel", rows, cols, seed)
        layers.append((v1.get_variable(f"{name}/kernel", initializer=tf.constant(kernel)),
                       v1.get_variable(f"{name}/bias", initializer=tf.zeros([cols]))))
    return layers


class LeastLoadedPs:
    """replica_device_setter's ps_strategy: each variable goes whole to the PS task holding the
    fewest bytes so far (what tf.contrib's GreedyLoadBalancingStrategy with byte_size_load_fn did)."""

    def __init__(self, num_tasks):
        self.bytes = [0] * num_tasks

    def __call__(self, op):
        shape = tf.TensorShape(op.get_attr("shape"))
        size = shape.num_elements() * tf.as_dtype(op.get_attr("dtype")).size
        task = self.bytes.index(min(self.bytes))
        self.bytes[task] += size
        return task


def logits_of(layers, x):
    h = x
    for i, (kernel, bias) in enumerate(layers):
        h = tf.matmul(h, kernel) + bias
        if i + 1 < len(layers):
            h = tf.nn.relu(h)
    return h


def optimizer_of(spec):
    if spec["type"] != "adam":
        raise ValueError(f"optimizer {spec['type']!r}: only adam is mapped")
    return v1.train.AdamOptimizer(spec["learning_rate"], beta1=spec["beta1"], beta2=spec["beta2"],
                                  epsilon=spec["epsilon"])


def run_ps(server):
    server.join()


class MlpJob:
    """The Fashion-MNIST MLP: what run_worker needs of an example (data, placement, graph, feeds,
    evaluation); tf_peer_census_v1.CensusJob is the other."""

    def __init__(self, plan, task, chief):
        self.plan = plan
        self.train_x, self.train_y = tf_peer_data.load_idx(plan["data"], "train")
        self.train_size = len(self.train_y)
        if chief:
            test_images, self.test_y = tf_peer_data.load_idx(plan["data"], "t10k")
            self.test_x = tf_peer_data.pixels(test_images)

    def ps_strategy(self):
        # Variables go whole to the least-loaded PS by bytes, largest first: kubetrain's placement
        # for variables under splitThresholdBytes (core/placement.h); here in creation order, which
        # for this MLP gives the same split (dense0/kernel alone on ps0, the rest with the global
        # step and Adam's beta powers on ps1; slots sit with their variables).
        return LeastLoadedPs(len(self.plan["cluster"]["ps"]))

    def build(self):
        """The variables (first: the placement is by bytes), placeholders and loss; returns
        (loss, optimizer)."""
        model = self.plan["model"]
        layers = dense_variables(model, self.plan["seed"])
        self.x = v1.placeholder(tf.float32, [None, model["input_dim"]])
        self.y = v1.placeholder(tf.int32, [None])
        logits = logits_of(layers, self.x)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=self.y, logits=logits))
        self.correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1, output_type=tf.int32), self.y), tf.int32))
        return loss, optimizer_of(self.plan["optimizer"])

    def feed(self, rows):
        return {self.x: tf_peer_data.pixels(self.train_x, rows), self.y: self.train_y[rows]}

    def evaluate(self, sess):
        return {"test_accuracy": sess.run(self.correct, {self.x: self.test_x, self.y: self.test_y}) / len(self.test_y)}


def run_worker(plan, task, server, cluster):
    workers = len(plan["cluster"]["worker"])
    chief = task == 0
    sync = plan["mode"] == "sync"
    batch = plan["batch_size"]
    target = plan["target_steps"]
    job = (tf_peer_census_v1.CensusJob if plan.get("example") == "census" else MlpJob)(plan, task, chief)
    # Sync: every worker runs exactly `target` steps; async: at most all of them.
    order = tf_peer_replica.batch_order(job.train_size, task, workers, plan["seed"], target * batch)

    setter = v1.train.replica_device_setter(
        cluster=cluster, worker_device=f"/job:worker/task:{task}", ps_strategy=job.ps_strategy())
    with tf.Graph().as_default():
        with v1.device(setter):
            loss, optimizer = job.build()
            global_step = v1.train.get_or_create_global_step()
            if sync:
                optimizer = v1.train.SyncReplicasOptimizer(
                    optimizer, replicas_to_aggregate=plan["replicas_to_aggregate"], total_num_replicas=workers)
            train_op = optimizer.minimize(loss, global_step=global_step)
        if chief:
            print("tf_peer: placement " + json.dumps({v.op.name: v.device for v in v1.global_variables()}), flush=True)
        # No StopAtStepHook: a stopped MonitoredSession refuses the final evaluation, so the
        # loop below stops itself, the way that hook decides (see reached_target).
        # num_tokens=0: no worker may start step k+1 before step k's aggregate is applied, i.e.
        # kubetrain's barrier. The default (replicas_to_aggregate tokens at the start) lets a fast
        # worker run a step ahead and fill an aggregate with two of its own gradients.
        hooks = [optimizer.make_session_run_hook(chief, num_tokens=0)] if sync else []
        config = v1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{task}"])

        ready = os.path.join(plan["run_dir"], "chief-ready")
        if not chief:
            # A worker's session checks once whether the chief has initialised the variables and
            # then sleeps 30 s (SessionManager's recovery_wait_secs) before the next check: wait
            # for the chief's word here instead, so no run pays those 30 s.
            while not os.path.exists(ready):
                time.sleep(0.02)

        with v1.train.MonitoredTrainingSession(
                master=server.target, is_chief=chief, hooks=hooks, config=config, checkpoint_dir=None,
                save_checkpoint_secs=None, save_summaries_steps=None, save_summaries_secs=None,
                log_step_count_steps=None) as sess:
            if chief:
                open(ready, "w").close()
            start = time.monotonic()

            def reached_target(step_before):
                # The global step fetched with the train op may be read before this step's update
                # (StopAtStepHook's reasoning): read it again only when it may have reached the end.
                return step_before + 1 >= target and sess.run(global_step) >= target

            every = plan["eval_every_steps"]
            next_eval = every if every > 0 else target + 1
            losses, used = [], 0
            while True:
                # (wraps only if dropped stale gradients made a worker run past its share)
                rows = np.take(order, np.arange(used, used + batch), mode="wrap")
                used += batch
                _, step_before, batch_loss = sess.run([train_op, global_step, loss], job.feed(rows))
                losses = (losses + [batch_loss])[-50:]
                if reached_target(step_before):
                    break
                if chief and step_before + 1 >= next_eval:
                    job.evaluate(sess)
                    next_eval = ((step_before + 1) // every + 1) * every
            if not chief:
                return
            final_step = int(sess.run(global_step))
            metrics = job.evaluate(sess)
            seconds = time.monotonic() - start
            examples_per_step = batch * (plan["replicas_to_aggregate"] if sync else 1)
            result = {"examples": final_step * examples_per_step, "seconds": seconds,
                      "global_step": final_step, **metrics,
                      "final_loss": float(np.mean(losses)) if losses else 0.0}
            print("tf_peer_result " + json.dumps(result), flush=True)
            # Closing the session would join the sync queue runners, which can wait on the other
            # worker; the launcher stops the remaining tasks instead.
            os._exit(0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", required=True, help="the JSON plan written by tf_peer.py")
    parser.add_argument("--job", required=True, choices=["ps", "worker"])
    parser.add_argument("--task", type=int, required=True)
    args = parser.parse_args()
    plan = json.load(open(args.plan))
    v1.disable_eager_execution()
    cluster = tf.train.ClusterSpec(plan["cluster"])
    server = tf.distribute.Server(cluster, job_name=args.job, task_index=args.task, protocol="grpc")
    if args.job == "ps":
        run_ps(server)
    else:
        run_worker(plan, args.task, server, cluster)


if __name__ == "__main__":
    main()
