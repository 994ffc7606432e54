"""The operator e2e (see test_e2e.py): the end of a job never destroys the only copy of
the parameters."""
import glob
import json
import os
import re
import subprocess
import tempfile
import time

from conftest import BIN
from e2e_helpers import apply, condition, container_pid, job, pods, status, task_logs, wait_for, wait_state


class PortForward:
    """What `kubectl port-forward pod/P LOCAL:REMOTE` does, for the test cluster (its node agent
    serves no kubelet API): as the kubelet's runtime does, every connection to 127.0.0.1:LOCAL is
    joined to localhost:REMOTE inside the pod's network namespace (the pod's process `pid`)."""
    RELAY = ("import os, socket, threading\n"
             "s = socket.create_connection(('127.0.0.1', {port}))\n"
             "def up():\n"
             "    while data := os.read(0, 65536):\n"
             "        s.sendall(data)\n"
             "    s.shutdown(socket.SHUT_WR)\n"
             "threading.Thread(target=up, daemon=True).start()\n"
             "while data := s.recv(65536):\n"
             "    os.write(1, data)\n")

    def __init__(self, local_port, pid, port):
        import socket
        import threading
        self.relay = ["nsenter", f"--net=/proc/{pid}/ns/net", "python3", "-c", self.RELAY.format(port=port)]
        self.server = socket.create_server(("127.0.0.1", local_port))
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        import threading
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            relay = subprocess.Popen(self.relay, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            threading.Thread(target=self.pump, args=(client.recv, relay.stdin, relay), daemon=True).start()
            threading.Thread(target=self.pump, args=(lambda n: os.read(relay.stdout.fileno(), n), client, relay),
                             daemon=True).start()

    @staticmethod
    def pump(read, sink, relay):
        import socket
        try:
            while data := read(65536):
                if isinstance(sink, socket.socket):
                    sink.sendall(data)
                else:
                    sink.write(data)
                    sink.flush()
        except OSError:
            pass
        finally:
            try:
                if isinstance(sink, socket.socket):
                    sink.shutdown(socket.SHUT_WR)
                else:
                    sink.close()
            except OSError:
                pass

    def close(self):
        self.server.close()


def test_ps_tasks_that_cannot_save_hold_the_parameters_until_the_model_is_exported(cluster):
    """The checkpoint directory (a tmpfs on a hostPath volume) turns read-only during training:
    the chief cannot export model.ktm, the job fails naming the directory, and cleanPodPolicy
    stops the PS tasks, which cannot write their final checkpoints either. They hold the
    parameters within their pods' long grace period; the operator keeps them and the job (its
    ttlSecondsAfterFinished waits) and says in ParametersHeld how to save the model. The recipe,
    run as written (port-forwards stood in for by local relays), exports a model that evaluates
    exactly as the chief's; ending the hold as it says lets the PS pods go, then the TTL."""
    k = cluster
    disk = tempfile.mkdtemp(prefix="kubetrain-e2e-hold.")
    # Writable by the runtime image's user as well (pods may run from the image).
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m,mode=1777", "tmpfs", disk], check=True)
    forwards = []
    work = tempfile.mkdtemp(prefix="kubetrain-e2e-export.")
    try:
        mount = "/mnt/kubetrain-e2e-ckpt"
        obj = job("hold", steps=3000, ps=2, workers=1, run_policy={"ttlSecondsAfterFinished": 1},
                  extra_training={"checkpoint": {"directory": mount, "everySteps": 100}})
        template = {"spec": {
            "containers": [{"name": "kubetrain", "volumeMounts": [{"name": "ckpt", "mountPath": mount}]}],
            "volumes": [{"name": "ckpt", "hostPath": {"path": disk, "type": "Directory"}}]}}
        for replica in obj["spec"]["replicaSpecs"].values():
            replica["template"] = template
        apply(k, obj)
        # The first checkpoint is written: from now on nothing can be.
        deadline = time.time() + 180
        while not glob.glob(os.path.join(disk, "ps-0", "ckpt-*")):
            assert time.time() < deadline, "no checkpoint written\n" + task_logs(k, "hold")
            time.sleep(0.02)
        deadline = time.time() + 30
        while subprocess.run(["mount", "-o", "remount,ro", disk], capture_output=True).returncode != 0:
            assert time.time() < deadline, "cannot remount the checkpoint tmpfs read-only"
            time.sleep(0.05)

        st = wait_state(k, "hold", {"Failed", "Succeeded"}, timeout=300)
        assert st["state"] == "Failed", st
        failed = condition(st, "Failed")["message"]
        assert f"cannot export the final model to {mount}/model.ktm" in failed, failed
        assert "spec.training.checkpoint.directory" in failed, failed

        def held():
            s = status(k, "hold")
            return s if (condition(s, "ParametersHeld") or {}).get("status") == "True" else None
        st = wait_for(k, "ParametersHeld", held, 120)
        message = condition(st, "ParametersHeld")["message"]
        assert condition(st, "ParametersHeld")["reason"] == "FinalCheckpointFailed", st
        assert message.startswith("hold-ps-0, hold-ps-1 could not write the final checkpoint to "
                                  f"spec.training.checkpoint.directory {mount}"), message
        ps_pods = {p["metadata"]["name"]: p for p in pods(k, "hold") if "-ps-" in p["metadata"]["name"]}
        assert sorted(ps_pods) == ["hold-ps-0", "hold-ps-1"], ps_pods
        for p in ps_pods.values():
            # Being deleted (cleanPodPolicy), still running: the kubelet waits for the hold.
            assert p["metadata"].get("deletionTimestamp") and p["status"]["phase"] == "Running", p["metadata"]
            assert p["spec"]["terminationGracePeriodSeconds"] == 720
        assert f"until {min(p['metadata']['deletionTimestamp'] for p in ps_pods.values())};" in message, message
        describe = k.run("describe", "tj", "hold").stdout
        assert "FinalCheckpointFailed" in describe and "port-forward pod/hold-ps-1" in describe, describe
        time.sleep(2)
        assert k.run("get", "tj", "hold", check=False).returncode == 0, "the TTL must wait for the PS tasks"

        # The recipe, line by line, as a user would run it.
        shell_env = dict(k.env, PATH=os.pathsep.join([os.path.dirname(k.binary), BIN, os.environ["PATH"]]))

        def sh(line):
            return subprocess.run(["bash", "-c", line], cwd=work, env=shell_env, capture_output=True,
                                  text=True, timeout=120)
        steps = [line.strip() for line in message.split("\n")[1:]]
        end_hold = steps.pop().split(": ", 1)[1]
        for step in steps:
            args = step.rstrip("&").split()
            if args[3] == "port-forward":
                local, remote = (int(x) for x in args[5].split(":"))
                pod = args[4].split("/", 1)[1]
                forwards.append(PortForward(local, container_pid(ps_pods[pod]), remote))
                continue
            done = sh(step)
            assert done.returncode == 0, f"{step}\n{done.stderr}"
            if args[0] == "kubetrain":
                assert "at global step 3000 from 2 PS tasks" in done.stderr, done.stderr
        ev = sh("kubetrain eval hold-model.ktm --json")
        assert ev.returncode == 0, ev.stderr
        with open(os.path.join(k.state, "node-agent", "logs", "default_hold-worker-0_kubetrain.log")) as f:
            chief_log = f.read()
        chief = re.search(r"chief: global step 3000/3000 test accuracy ([0-9.]+)", chief_log)
        assert chief, chief_log[-3000:]
        assert abs(json.loads(ev.stdout)["test_accuracy"] - float(chief.group(1))) < 1e-4, ev.stdout

        # Ending the hold lets the PS pods go (ParametersHeld turns False), then the TTL.
        assert end_hold == "kubectl -n default delete pod hold-ps-0 hold-ps-1 --grace-period=1", end_hold
        done = sh(end_hold)
        assert done.returncode == 0, done.stderr
        wait_for(k, "the job deleted by its TTL",
                 lambda: k.run("get", "tj", "hold", check=False).returncode != 0, 60)
        assert not pods(k, "hold")
        reasons = [e["reason"] for e in
                   k.json("get", "events", "--field-selector", "involvedObject.name=hold")["items"]]
        assert "FinalCheckpointFailed" in reasons and "ParametersReleased" in reasons, reasons
    finally:
        for f in forwards:
            f.close()
        k.run("delete", "tj", "hold", "--wait=false", check=False)
        subprocess.run(["umount", "-l", disk], check=False)
