"""Authentication between a job's tasks (issue 9, finding 7), with real
processes on loopback: credentials written the way the operator's Secret
mounts them (core/job_credentials.h), tokens computed here with Python's own
HMAC-SHA256 (an independent check of the token formula), and whole
`kubetrain run` jobs with and without --tls."""
import hashlib
import hmac
import json
import os
import re
import secrets
import signal
import stat

from conftest import job_yaml, run_cli, run_job


def token(job_key, task_type, index):
    return hmac.new(job_key.encode(), f"kubetrain/v1/{task_type}/{index}".encode(),
                    hashlib.sha256).hexdigest()


def auth_dir(tmp_path, name, files):
    d = tmp_path / name
    d.mkdir(mode=0o700)
    for file, content in files.items():
        (d / file).write_text(content)
    return str(d)


def test_a_task_with_another_jobs_token_exits_2_with_the_reason(cluster_factory, tmp_path):
    key, other_key = secrets.token_hex(32), secrets.token_hex(32)
    c = cluster_factory(job_yaml("auth", ps=1, workers=1, steps=50), ps=1, workers=1)
    c.start("ps", 0, "--auth_dir=" + auth_dir(tmp_path, "ps-0", {"job.key": key + "\n"}))
    stranger = c.start("worker", 0, "--auth_dir=" + auth_dir(
        tmp_path, "stranger", {"token": token(other_key, "worker", 0)}))
    # Refused at its first call, not retried until a timeout.
    assert stranger.wait(timeout=120) == 2, c.log("worker", 0)
    log = c.log("worker", 0)
    assert re.search(r"error: .*GetInfo: the token presented as worker/0 is not that task's token "
                     r"in this job \(another job's credentials, or another task's\); give the task "
                     r"this job's auth directory \(KUBETRAIN_AUTH_DIR or --auth_dir; on Kubernetes "
                     r"the job's Secret\)", log), log
    assert c.procs[("ps", 0)].poll() is None, c.log("ps", 0)
    assert "refused GetInfo from" in c.log("ps", 0)
    assert "admits only auth's tasks: tokens checked, no TLS (plaintext)" in c.log("ps", 0)
    # The job's own token (computed here, not by kubetrain) trains the job to its end.
    worker = c.start("worker", 0, "--auth_dir=" + auth_dir(
        tmp_path, "worker-0", {"token": token(key, "worker", 0)}))
    assert worker.wait(timeout=240) == 0, c.log("worker", 0)
    assert c.procs[("ps", 0)].wait(timeout=120) == 0, c.log("ps", 0)


def test_a_ps_without_credentials_refuses_to_start_unless_insecure(cluster_factory):
    c = cluster_factory(job_yaml("refused", ps=1, workers=1, steps=20), ps=1, workers=1)
    assert c.start("ps", 0, insecure=False).wait(timeout=60) == 2, c.log("ps", 0)
    log = c.log("ps", 0)
    assert "error: ps:0 has no credentials: without a job key it would serve any client that " \
           "reaches its port (pushes, pulls, Shutdown); give it the job's auth directory " \
           "(--auth_dir or $KUBETRAIN_AUTH_DIR, holding job.key; `kubetrain run` and the operator " \
           "do), or pass --insecure (or KUBETRAIN_INSECURE=1) to run it open on a network only " \
           "the job can reach" in log, log


def test_an_insecure_ps_warns_that_it_runs_open(cluster_factory):
    c = cluster_factory(job_yaml("open", ps=1, workers=1, steps=20), ps=1, workers=1)
    c.start("ps", 0, "--insecure", insecure=False)
    c.start("worker", 0)
    codes = c.wait_all()
    assert codes == {("ps", 0): 0, ("worker", 0): 0}, (codes, c.log("ps", 0))
    assert c.log("ps", 0).count("warning: ps:0 runs open (--insecure): no auth directory (--auth_dir, "
                                "KUBETRAIN_AUTH_DIR), so any client that reaches its port may push, "
                                "pull or end the job") == 1


def train(tmp_path, name, *args):
    d = tmp_path / name
    d.mkdir()
    text = job_yaml("tls", ps=2, workers=2, hidden="[64]", steps=200, batch=64, lr=0.001)
    model = d / "model.ktm"
    proc, summary = run_job(d, text, "--export_model", str(model), *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["status"] == "Succeeded", summary
    assert summary["gradients_applied"] == 200 * 2 * 2, summary
    assert summary["total_restarts"] == 0, summary
    return model, proc.stderr


def test_kubetrain_run_tls_trains_the_same_model_as_without(tmp_path):
    plain, plain_log = train(tmp_path, "plain")
    tls, tls_log = train(tmp_path, "tls", "--tls")
    for log, words in ((plain_log, "tokens checked, no TLS (plaintext)"),
                       (tls_log, "tokens checked, mutual TLS under the job's CA")):
        assert log.count(f"admits only tls's tasks: {words}") == 2, log[-3000:]
        # The credentials lived in a private directory, removed at the end.
        m = re.search(r"kubetrain run: task credentials \(tokens(, mutual TLS)?\) in (\S+), removed "
                      r"at the end", log)
        assert m, log[-3000:]
        assert not os.path.exists(m.group(2)), m.group(2)
    # Sync mode with a fixed seed: TLS changes the wire, not the arithmetic.
    assert plain.read_bytes() == tls.read_bytes()
    evals = [run_cli("eval", str(m), "--json") for m in (plain, tls)]
    assert all(e.returncode == 0 for e in evals), evals
    accuracy = [json.loads(e.stdout)["test_accuracy"] for e in evals]
    assert accuracy[0] == accuracy[1] > 0.5, accuracy


def test_kubetrain_run_gives_each_task_a_private_directory(tmp_path, live_runs):
    run = live_runs(tmp_path, job_yaml("dirs", ps=1, workers=2, steps=100000), "--tls")
    run.wait_for_ports(3)
    run.wait_for_step("ps-0", 1)
    m = re.search(r"task credentials \(tokens, mutual TLS\) in (\S+),", run.output())
    assert m, run.output()
    root = m.group(1)
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    listing = {task: sorted(os.listdir(os.path.join(root, task))) for task in os.listdir(root)}
    assert listing == {
        "ps-0": ["ca.crt", "job.key", "tls.crt", "tls.key"],
        "worker-0": ["ca.crt", "tls.crt", "tls.key", "token"],
        "worker-1": ["ca.crt", "tls.crt", "tls.key", "token"],
        "export": ["ca.crt", "job.key", "tls.crt", "tls.key"],
    }, listing
    key = open(os.path.join(root, "ps-0", "job.key")).read()
    for w in (0, 1):
        path = os.path.join(root, f"worker-{w}", "token")
        assert open(path).read() == token(key, "worker", w)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    run.proc.send_signal(signal.SIGINT)  # Ctrl-C: the tasks stop, the directory goes
    code, _ = run.finish(timeout=120)
    assert code == 130, run.output()[-3000:]
    assert not os.path.exists(root), root
