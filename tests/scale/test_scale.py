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


def run(*extra):
    proc = subprocess.run([sys.executable, os.path.join(HERE, "run_scale.py"), "--jobs", "60",
                           "--nodes", "6", *extra], capture_output=True, text=True, timeout=1500)
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
