"""The short version of tests/scale/run_scale.py (which runs 1000 jobs by
hand): 60 TrainingJobs of 1 PS + 4 workers through creation, running,
success and cleanup on kwok nodes against a real kube-apiserver, once
plainly and once with the operator SIGKILLed and restarted half way through
creation. run_scale.py itself checks that every job Succeeded, every pod,
Service and ConfigMap was created exactly once (201s counted by the API
server) and nothing is left; here also the request budget and the memory."""
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def run(*extra, sized=False):
    """run_scale.py with `extra` (60 jobs on 6 nodes unless `sized`: extra names its own)."""
    base = [] if sized else ["--jobs", "60", "--nodes", "6"]
    proc = subprocess.run([sys.executable, os.path.join(HERE, "run_scale.py"), *base, *extra],
                          capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    last = proc.stdout.strip().splitlines()[-1]
    print(last)
    return {k: float(v) for k, v in re.findall(r"(\w+)=([0-9.]+)", last)}


@pytest.mark.parametrize("kill", [False, True], ids=["plain", "operator-killed"])
def test_scale_short(kill):
    figures = run(*(["--kill-operator"] if kill else []))
    assert figures["jobs"] == 60 and figures["pods"] == 300
    assert figures["operator_restarts"] == (1 if kill else 0)
    assert figures["api_requests_per_object"] <= 3.0, figures
    assert figures["op_rss_mib"] <= 100, figures


def test_scale_pods_that_fail_are_handled_per_restart_policy_and_backoff_limit():
    """kwok's pod-fail stage (run_scale.py --failing-jobs/--retrying-jobs): workers that
    exit 1 under restartPolicy Never fail their job (reason TrainingJobFailed); a PS that
    exits 137 under restartPolicy ExitCode is recreated backoffLimit times, then the job
    fails (BackoffLimitExceeded); the other jobs succeed. run_scale.py checks each
    job's outcome, the recreations each job's status counts, and that the API server
    created exactly that many pods more (none twice)."""
    figures = run("--jobs", "12", "--nodes", "3", "--failing-jobs", "3", "--retrying-jobs", "3",
                  "--backoff-limit", "1", "--fail-delay-ms", "300", "--fail-jitter-ms", "700",
                  "--no-reference", sized=True)
    assert figures["failing_jobs"] == 3 and figures["retrying_jobs"] == 3, figures
    assert figures["recreated_pods"] == 3, figures  # backoffLimit 1: once per retrying job
