"""The Census wide & deep job for tf_peer_compat_v1.py (tf.compat.v1 graph, SyncReplicasOptimizer):
the model, its placement and optimizers as kubetrain runs examples/census-income-wide-deep.yaml.

- Tables (embeddings [vocab, dim], the wide part's weights [vocab, 1], crossed columns
  [buckets, 1]) are split by row over the PS tasks, row r on PS r mod P as local row r // P:
  kubetrain's placement, TensorFlow's `embedding_lookup(..., partition_strategy="mod")` over one
  variable per PS. The dense variables go whole to PS tasks as kubetrain's greedy placement puts
  them (largest first, ties by name, onto the least-loaded task by bytes).
- The deep tower's input: the normalised numeric columns, then each embedding's row (mean
  combiner over at most one id: the row itself; no id: zeros), in the job's order.
- Optimizers: the job's Adam for the tower, wide.bias and (row-wise, "lazy") the embedding rows a
  step touched; the wide part's tables with Adagrad in kubetrain's (and Keras's) form,
  accumulator from initialAccumulator and epsilon added to its square root (TensorFlow's
  ResourceApplyAdagradV2 kernel; TF1's AdagradOptimizer has no epsilon).
- The tables' gradients go to the PS as dense tensors: SyncReplicasOptimizer would aggregate
  IndexedSlices in a SparseConditionalAccumulator, which averages each row over the gradients
  that hold it, where kubetrain averages every row over the workers (sum / 2)."""
import re

import numpy as np
import tensorflow as tf

import tf_peer_census_data
import tf_peer_replica

v1 = tf.compat.v1


def dense_placement(variables, num_ps):
    """kubetrain's greedy placement of whole dense variables ({name: bytes} -> {name: task})."""
    load, out = [0] * num_ps, {}
    for name, size in sorted(variables.items(), key=lambda kv: (-kv[1], kv[0])):
        task = load.index(min(load))
        out[name] = task
        load[task] += size
    return out


class LazyRowsAdam(v1.train.AdamOptimizer):
    """Adam, except that for the variables in `lazy` only the rows with a non-zero gradient (the
    rows a step touched) are updated, values and slots (TF1 contrib's LazyAdamOptimizer rule;
    kubetrain's RowOptimizer). The bias correction uses the shared step, as kubetrain's shard."""

    def __init__(self, lazy, **kwargs):
        super().__init__(**kwargs)
        self._lazy = set(lazy)

    def _resource_apply_dense(self, grad, var):
        if var.op.name not in self._lazy:
            return super()._resource_apply_dense(grad, var)
        rows = tf.reshape(tf.where(tf.reduce_any(tf.not_equal(grad, 0), axis=1)), [-1])
        g = tf.gather(grad, rows)
        beta1_power, beta2_power = self._get_beta_accumulators()
        dtype = var.dtype.base_dtype
        b1, b2 = tf.cast(self._beta1_t, dtype), tf.cast(self._beta2_t, dtype)
        lr = tf.cast(self._lr_t, dtype) * tf.sqrt(1 - beta2_power) / (1 - beta1_power)
        m, v = self.get_slot(var, "m"), self.get_slot(var, "v")
        m_t = b1 * tf.gather(m, rows) + (1 - b1) * g
        v_t = b2 * tf.gather(v, rows) + (1 - b2) * tf.square(g)
        step = lr * m_t / (tf.sqrt(v_t) + tf.cast(self._epsilon_t, dtype))
        return tf.group(v1.scatter_update(m, rows, m_t), v1.scatter_update(v, rows, v_t),
                        v1.scatter_sub(var, rows, step))


class AdagradEpsilon(v1.train.AdagradOptimizer):
    """Adagrad with epsilon: a += g^2; w -= lr * g / (sqrt(a) + epsilon)."""

    def __init__(self, learning_rate, initial_accumulator_value, epsilon):
        super().__init__(learning_rate, initial_accumulator_value=initial_accumulator_value)
        self._epsilon = epsilon

    def _resource_apply_dense(self, grad, var):
        dtype = var.dtype.base_dtype
        return tf.raw_ops.ResourceApplyAdagradV2(
            var=var.handle, accum=self.get_slot(var, "accumulator").handle,
            lr=tf.cast(self._learning_rate_tensor, dtype), epsilon=tf.constant(self._epsilon, dtype),
            grad=grad, use_locking=False)


class SplitOptimizer(v1.train.Optimizer):
    """The deep optimizer for most variables, the wide one for the wide part's tables; table
    gradients dense (see the module doc)."""

    def __init__(self, deep, wide, wide_vars, table_vars):
        super().__init__(use_locking=False, name="Split")
        self._deep, self._wide = deep, wide
        self._wide_vars, self._table_vars = set(wide_vars), set(table_vars)

    def compute_gradients(self, loss, var_list=None, **kwargs):
        pairs = self._deep.compute_gradients(loss, var_list=var_list, **kwargs)
        return [(tf.convert_to_tensor(g) if v.op.name in self._table_vars else g, v) for g, v in pairs]

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        grads_and_vars = list(grads_and_vars)
        wide = [(g, v) for g, v in grads_and_vars if v.op.name in self._wide_vars]
        deep = [(g, v) for g, v in grads_and_vars if v.op.name not in self._wide_vars]
        if self._wide is None or not wide:
            return self._deep.apply_gradients(grads_and_vars, global_step=global_step, name=name)
        wide_op = self._wide.apply_gradients(wide)
        with tf.control_dependencies([wide_op]):
            return self._deep.apply_gradients(deep, global_step=global_step, name=name)


class CensusJob:
    """What tf_peer_compat_v1.run_worker needs of an example: data, placement, graph, feeds, eval."""

    def __init__(self, plan, task, chief):
        self.plan = plan
        self.train, test = tf_peer_census_data.load(plan["data"], plan["model"]["wide"]["crossed"])
        self.test = test if chief else None
        self.train_size = len(self.train["labels"])
        self.num_ps = len(plan["cluster"]["ps"])
        self.columns = {c["name"]: c for c in plan["data"]["columns"]}
        self.dense_dim = self.train["dense"].shape[1]
        model = plan["model"]
        sizes = {}
        width = self.dense_dim + sum(e["dim"] for e in model["embeddings"])
        for i, layer in enumerate(model["layers"]):
            sizes[f"layers.{i}.kernel"] = width * layer["units"] * 4
            sizes[f"layers.{i}.bias"] = layer["units"] * 4
            width = layer["units"]
        sizes["wide.bias"] = 4
        self.placement = dense_placement(sizes, self.num_ps)

    def ps_strategy(self):
        """replica_device_setter's ps_strategy: tables by the "/shard<k>" of their name, dense
        variables by kubetrain's placement, slots ("<variable>/Adam") with their variables, the
        rest (global step, Adam's beta powers) on PS 0."""
        def task_of(op):
            shard = re.search(r"/shard(\d+)(/|$)", op.name)
            return int(shard.group(1)) if shard else self.placement.get(op.name.split("/")[0], 0)
        return task_of

    def _table(self, name, rows, dim, initial):
        """One variable per PS, rows k, k+P, ... of the table on PS k."""
        return [v1.get_variable(f"{name}/shard{k}", initializer=tf.constant(initial[k::self.num_ps]),
                                use_resource=True) for k in range(self.num_ps)]

    def _lookup(self, parts, ids):
        valid = ids >= 0
        rows = v1.nn.embedding_lookup(parts, tf.where(valid, ids, tf.zeros_like(ids)),
                                      partition_strategy="mod")
        return rows * tf.cast(valid, tf.float32)[:, None]

    def build(self):
        """The variables, placeholders and loss; returns (loss, optimizer)."""
        plan, model, seed = self.plan, self.plan["model"], self.plan["seed"]
        self.dense = v1.placeholder(tf.float32, [None, self.dense_dim])
        names = list(self.train["ids"])
        self.ids = {n: v1.placeholder(tf.int64, [None], name=f"ids_{i}") for i, n in enumerate(names)}
        crossed = model["wide"]["crossed"]
        self.crossed = [v1.placeholder(tf.int64, [None], name=f"crossed_{i}") for i in range(len(crossed))]
        self.labels = v1.placeholder(tf.float32, [None])
        # Variables first (layers, then tables, then wide.bias), as kubetrain lists them.
        layers, width = [], self.dense_dim + sum(e["dim"] for e in model["embeddings"])
        for i, layer in enumerate(model["layers"]):
            kernel = tf_peer_replica.initial_kernel(f"layers.{i}.kernel", width, layer["units"], seed,
                                                   he=layer["activation"] == "relu")
            layers.append((v1.get_variable(f"layers.{i}.kernel", initializer=tf.constant(kernel), use_resource=True),
                           v1.get_variable(f"layers.{i}.bias", initializer=tf.zeros([1, layer["units"]]),
                                           use_resource=True), layer["activation"]))
            width = layer["units"]
        tables, wide_tables = [], []
        for e in model["embeddings"]:
            rows = tf_peer_census_data.vocab_size(self.columns[e["column"]])
            name = "embedding." + e["column"]
            init = tf_peer_census_data.initial_table(name, rows, e["dim"], seed)
            tables.append((self._table(name, rows, e["dim"], init), self.ids[e["column"]]))
        for c in model["wide"]["columns"]:
            rows = tf_peer_census_data.vocab_size(self.columns[c])
            wide_tables.append((self._table("wide." + c, rows, 1, np.zeros((rows, 1), np.float32)), self.ids[c]))
        for x, ph in zip(crossed, self.crossed):
            rows = x["hash_buckets"]
            name = "wide." + "_x_".join(x["columns"])
            wide_tables.append((self._table(name, rows, 1, np.zeros((rows, 1), np.float32)), ph))
        wide_bias = v1.get_variable("wide.bias", initializer=tf.zeros([1, 1]), use_resource=True)

        h = tf.concat([self.dense] + [self._lookup(parts, ids) for parts, ids in tables], axis=1)
        for kernel, bias, activation in layers:
            h = tf.matmul(h, kernel) + bias
            if activation == "relu":
                h = tf.nn.relu(h)
        wide = wide_bias + tf.add_n([self._lookup(parts, ids) for parts, ids in wide_tables])
        self.logits = tf.reshape(h + wide, [-1])
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=self.labels, logits=self.logits))

        table_vars = [p.op.name for parts, _ in tables + wide_tables for p in parts]
        wide_vars = [p.op.name for parts, _ in wide_tables for p in parts]
        wide_spec = plan["wide_optimizer"]
        lazy = table_vars if wide_spec is None else [n for n in table_vars if n not in wide_vars]
        o = plan["optimizer"]
        deep = LazyRowsAdam(lazy, learning_rate=o["learning_rate"], beta1=o["beta1"], beta2=o["beta2"],
                            epsilon=o["epsilon"])
        wide_opt = None if wide_spec is None else AdagradEpsilon(
            wide_spec["learning_rate"], wide_spec["initialAccumulator"], wide_spec["epsilon"])
        return loss, SplitOptimizer(deep, wide_opt, wide_vars, table_vars)

    def _feed(self, data, rows=None):
        pick = (lambda a: a) if rows is None else (lambda a: a[rows])
        feed = {self.dense: pick(data["dense"]), self.labels: pick(data["labels"]).astype(np.float32)}
        feed.update({ph: pick(data["ids"][name]) for name, ph in self.ids.items()})
        feed.update({ph: pick(ids) for ph, ids in zip(self.crossed, data["crossed"])})
        return feed

    def feed(self, rows):
        return self._feed(self.train, rows)

    def evaluate(self, sess):
        """Accuracy (logit >= 0) and AUC (ties counted half) of the test set, as Model::Evaluate."""
        logits = sess.run(self.logits, self._feed(self.test)).astype(np.float64)
        labels = self.test["labels"]
        return {"test_accuracy": float(np.mean((logits >= 0) == (labels == 1))), "test_auc": auc(logits, labels)}


def auc(score, labels):
    """Mann-Whitney U over mid-ranks (core/model.cc Auc); 0.5 when a class is absent."""
    _, inverse, counts = np.unique(score, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    mid_rank = (ends - counts + 1 + ends) / 2.0  # 1-based mid-rank of each distinct score
    positives = float(np.sum(labels == 1))
    negatives = len(labels) - positives
    if positives == 0 or negatives == 0:
        return 0.5
    rank_sum = float(np.sum(mid_rank[inverse][labels == 1]))
    return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)
