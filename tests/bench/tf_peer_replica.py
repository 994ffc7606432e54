"""kubetrain's initial values and per-worker batch order, reproduced bit for bit in numpy, so the
TensorFlow side of tests/bench/tf_peer starts from the same weights and sees the same batches.

The C++ this mirrors: Model::InitialValue (core/model.cc), ShardedBatcher::ShardOf / StartPass /
NextRecord (core/dataset.cc), Fnv1a64 / SplitMix64 (core/hash.h), and the standard library's
std::mt19937_64 and std::seed_seq (both fully specified by the C++ standard, so any conforming
library gives these numbers)."""
import numpy as np

MASK64 = (1 << 64) - 1
MASK32 = (1 << 32) - 1


def fnv1a64(text):
    h = 14695981039346656037
    for byte in text.encode():
        h = ((h ^ byte) * 1099511628211) & MASK64
    return h


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def seed_seq_generate(seeds, count):
    """std::seed_seq(seeds).generate() of `count` 32-bit words ([rand.util.seedseq])."""
    out = [0x8B8B8B8B] * count
    s, n = len(seeds), count
    t = 11 if n >= 623 else 7 if n >= 68 else 5 if n >= 39 else 3 if n >= 7 else (n - 1) // 2
    p = (n - t) // 2
    q = p + t
    m = max(s + 1, n)

    def mix(x):
        return x ^ (x >> 27)

    for k in range(m):
        r1 = (1664525 * mix(out[k % n] ^ out[(k + p) % n] ^ out[(k - 1) % n])) & MASK32
        if k == 0:
            r2 = r1 + s
        elif k <= s:
            r2 = r1 + k % n + seeds[k - 1]
        else:
            r2 = r1 + k % n
        r2 &= MASK32
        out[(k + p) % n] = (out[(k + p) % n] + r1) & MASK32
        out[(k + q) % n] = (out[(k + q) % n] + r2) & MASK32
        out[k % n] = r2
    for k in range(m, m + n):
        r3 = (1566083941 * mix((out[k % n] + out[(k + p) % n] + out[(k - 1) % n]) & MASK32)) & MASK32
        r4 = (r3 - k % n) & MASK32
        out[(k + p) % n] ^= r3
        out[(k + q) % n] ^= r4
        out[k % n] = r4
    return out


class Mt19937_64:
    """std::mt19937_64, drawing whole 312-word blocks at once with numpy."""
    N, M = 312, 156
    MATRIX_A = np.uint64(0xB5026F5AA96619E9)
    UPPER, LOWER = np.uint64(0xFFFFFFFF80000000), np.uint64(0x7FFFFFFF)

    def __init__(self, seed=None, seed_words=None):
        if seed_words is not None:  # seeded from a std::seed_seq over these 32-bit words
            words = seed_seq_generate(list(seed_words), 2 * self.N)
            state = [words[2 * i] | (words[2 * i + 1] << 32) for i in range(self.N)]
            if state[0] >> 31 == 0 and not any(state[1:]):
                state[0] = 1 << 63
        else:
            state = [seed & MASK64]
            for i in range(1, self.N):
                prev = state[-1]
                state.append((6364136223846793005 * (prev ^ (prev >> 62)) + i) & MASK64)
        self.state = np.array(state, dtype=np.uint64)
        self.buffer = np.empty(0, dtype=np.uint64)

    def _twist(self):
        mt, n, m = self.state, self.N, self.M

        def rows(i, nxt, far):
            y = (mt[i] & self.UPPER) | (nxt & self.LOWER)
            return far ^ (y >> np.uint64(1)) ^ np.where(y & np.uint64(1), self.MATRIX_A, np.uint64(0))

        # The recurrence reads mt[i + m] and mt[i + 1] mod n: the first n - m rows read only old
        # words, the next ones read rows already replaced in this round, the last one mt[0] (new).
        mt[0:n - m] = rows(np.s_[0:n - m], mt[1:n - m + 1], mt[m:n])
        mt[n - m:n - 1] = rows(np.s_[n - m:n - 1], mt[n - m + 1:n], mt[0:m - 1])
        mt[n - 1:n] = rows(np.s_[n - 1:n], mt[0:1], mt[m - 1:m])
        y = mt.copy()
        y ^= (y >> np.uint64(29)) & np.uint64(0x5555555555555555)
        y ^= (y << np.uint64(17)) & np.uint64(0x71D67FFFEDA60000)
        y ^= (y << np.uint64(37)) & np.uint64(0xFFF7EEE000000000)
        y ^= y >> np.uint64(43)
        return y

    def draw(self, count):
        """The next `count` outputs as a uint64 array."""
        parts, have = [self.buffer], len(self.buffer)
        while have < count:
            block = self._twist()
            parts.append(block)
            have += len(block)
        everything = np.concatenate(parts)
        self.buffer = everything[count:]
        return everything[:count]

    def next(self):
        return int(self.draw(1)[0])


def initial_kernel(name, rows, cols, seed, he=False):
    """A dense kernel's initial value: kubetrain's Glorot-uniform (He-uniform for a relu layer of a
    `layers` model; the mlp shorthand keeps Glorot) from a generator keyed by (seed, name)."""
    limit = np.sqrt(6.0 / rows) if he else np.sqrt(6.0 / (rows + cols))
    rng = Mt19937_64(splitmix64(seed ^ splitmix64(fnv1a64(name))))
    uniform01 = (rng.draw(rows * cols) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    return ((2.0 * uniform01 - 1.0) * limit).astype(np.float32).reshape(rows, cols)


def shard_of(n, num_shards, seed):
    """ShardedBatcher::ShardOf: which worker record n of a pass goes to."""
    if num_shards <= 1:
        return 0
    rotation = splitmix64(seed ^ splitmix64(n // num_shards)) % num_shards
    return (n % num_shards + rotation) % num_shards


def shard_records(total, shard, num_shards, seed):
    """The record numbers (in file order) of one worker's shard."""
    return [n for n in range(total) if shard_of(n, num_shards, seed) == shard]


def pass_order(records, seed, epoch, shard, buffer_records=65536):
    """The order ShardedBatcher emits one pass of its shard when the whole shard fits in the
    shuffle buffer (true for every job this bench runs: the buffer default holds 65536): the
    buffer fills in file order, then each draw takes rng() % size and moves the last into the hole.
    """
    if len(records) > buffer_records:
        raise ValueError(f"a shard of {len(records)} records does not fit the {buffer_records}-record "
                         "shuffle buffer; only the draining order is reproduced")
    rng = Mt19937_64(seed_words=[seed & MASK32, seed >> 32, epoch & MASK32, epoch >> 32, shard])
    buffer = list(records)
    draws = rng.draw(len(buffer))
    order = []
    for r in draws:
        j = int(r) % len(buffer)
        order.append(buffer[j])
        buffer[j] = buffer[-1]
        buffer.pop()
    return order


def batch_order(total, shard, num_shards, seed, examples):
    """The first `examples` record numbers worker `shard` trains on, pass after pass (a batch that
    reaches the end of the shard continues into the next pass)."""
    records = shard_records(total, shard, num_shards, seed)
    order, epoch = [], 0
    while len(order) < examples:
        order.extend(pass_order(records, seed, epoch, shard))
        epoch += 1
    return np.array(order[:examples], dtype=np.int64)
