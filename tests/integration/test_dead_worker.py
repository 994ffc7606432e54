"""A sync worker that stops answering (SIGSTOP: alive to the kernel, silent to
the PS) no longer stalls the job with barrierTimeoutSeconds (issue 9, finding
6): the first barrier it misses times out once, then it is absent and every
later step aggregates the live worker without waiting again, until it pushes
again. Speed is compared as a ratio of two runs measured in this test (one
worker alone, two workers with one stopped), never against wall-clock
thresholds: both jobs run at once and are measured over the same window."""
import os
import signal
import time

from conftest import job_yaml

STEPS = 1000000  # never reached: the runs are stopped after the measurement
WINDOW = 4.0     # seconds of steps counted per run


def spec(name, workers):
    return job_yaml(name, ps=1, workers=workers, hidden="[32]", steps=STEPS, batch=32,
                    extra_training="    barrierTimeoutSeconds: 1\n")


def steps_per_second(runs, task="ps-0"):
    """Steps/s of each run over the same window (so machine load hits both alike)."""
    v0, t0 = [r.metric(task, "kubetrain_global_step") for r in runs], time.time()
    time.sleep(WINDOW)
    v1, t1 = [r.metric(task, "kubetrain_global_step") for r in runs], time.time()
    return [(b - a) / (t1 - t0) for a, b in zip(v0, v1)]


def wait_for_metric(run, task, name, value, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if run.metric(task, name) == value:
            return
        time.sleep(0.05)
    raise AssertionError(f"{task} {name} never {value}: " + run.output()[-3000:])


def test_a_stopped_worker_is_absent_and_the_job_runs_at_one_worker_speed(tmp_path, live_runs):
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = live_runs(tmp_path / "one", spec("one-worker", 1))
    two = live_runs(tmp_path / "two", spec("stopped-worker", 2))
    one.wait_for_ports(2)
    two.wait_for_ports(3)
    one.wait_for_step("ps-0", 100)
    two.wait_for_step("ps-0", 100)
    pid = two.pid_of("worker-1")
    os.kill(pid, signal.SIGSTOP)
    try:
        # One barrier times out (1 s), then worker 1 is absent.
        wait_for_metric(two, "ps-0", "kubetrain_absent_workers", 1)
        timeouts = two.metric("ps-0", "kubetrain_barrier_timeouts_total")
        one_rate, stopped_rate = steps_per_second([one, two])
        # No barrier waited for it again.
        assert two.metric("ps-0", "kubetrain_barrier_timeouts_total") == timeouts
        # The chief (worker 0) reports it in its progress, which the launcher shows.
        deadline = time.time() + 30
        while time.time() < deadline and "absent workers 1" not in two.output():
            time.sleep(0.1)
        assert "absent workers 1" in two.output(), two.output()[-3000:]
        # ... and exports it for the operator (.status.progress.absentWorkers).
        wait_for_metric(two, "worker-0", "kubetrain_job_absent_workers", 1)
    finally:
        os.kill(pid, signal.SIGCONT)
    # It comes back: its next push makes it present again.
    wait_for_metric(two, "ps-0", "kubetrain_absent_workers", 0)
    one.kill()
    two.kill()
    print(f"steps/s: one worker {one_rate:.1f}, two with one stopped {stopped_rate:.1f}")
    # Before: one step per barrierTimeoutSeconds (1 step/s here).
    assert stopped_rate >= one_rate / 2, (stopped_rate, one_rate)
