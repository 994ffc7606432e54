"""Pod networking for the test node agent (tests/cluster/node_agent.py).

NetnsNetwork (the default) does what a CNI bridge plugin does on a real node: each pod gets
its own network namespace, joined by a veth pair to one Linux bridge per agent, with an
address from a private /20 (the bridge holds the .1 gateway). A pod can then bind any port,
including 0.0.0.0:2222 as TensorFlow's servers do, and `localhost` is its own. The host
reaches every pod through the bridge, so tests and Prometheus scrape pod IPs as before.
Nothing is routed off the machine: pods get no default route (only their /20 and the
Service address below), the bridge has no uplink and no NAT, and each pod's /etc/resolv.conf
names no outside DNS server (Service names are in the agent's hosts file).

Inside every pod, the `kubernetes` Service's ClusterIP and port (10.0.0.1:443, in the test
API server's certificate) is a listening socket of the agent, relayed to the API server of
the kubeconfig — the part of kube-proxy an in-cluster client needs.

LoopbackNetwork is the old mode (--pod-network loopback): every pod shares the host's network
and gets its own 127.10.x.y, so pods only avoid each other by binding their own IP.

Needs root and iproute2 (`ip`), nsenter (util-linux). Python 3.11 stdlib only.
"""
import collections, ctypes, hashlib, ipaddress, json, os, socket, subprocess, threading

CLONE_NEWNET = 0x40000000
API_SERVICE_IP, API_SERVICE_PORT = "10.0.0.1", 443  # up.sh: --service-cluster-ip-range 10.0.0.0/24
POD_RANGE = ipaddress.ip_network("10.244.0.0/16")  # split into /20s, one per running agent
_libc = ctypes.CDLL(None, use_errno=True)


def _ip(*args, check=True):
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip() or 'exit ' + str(proc.returncode)}")
    return proc


class LoopbackNetwork:
    """Every pod on the host network with its own loopback address 127.10.x.y."""
    mode, host_ip, resolv_conf = "loopback", "127.0.0.1", None  # the host's resolv.conf

    def __init__(self):
        self.used, self.next = set(), 2

    def add(self, uid):
        for _ in range(254 * 256):
            n, self.next = self.next, self.next + 1 if self.next < 256 * 256 - 2 else 2
            if n % 256 not in (0, 1, 255) and n not in self.used:
                self.used.add(n)
                return f"127.10.{n // 256}.{n % 256}"
        raise RuntimeError("no free pod IPs in 127.10.0.0/16")

    def remove(self, uid, ip):
        a, b = ip.split(".")[2:4]
        self.used.discard(int(a) * 256 + int(b))

    def enter_argv(self, uid):
        return []

    def api_endpoint(self, api_host, api_port):
        return api_host, api_port

    def close(self):
        pass


class NetnsNetwork:
    """One network namespace per pod on a per-agent bridge; see the module docstring."""
    mode = "netns"

    def __init__(self, key, api_host, api_port, log, state_dir):
        tag = hashlib.sha1(key.encode()).hexdigest()[:6]
        self.bridge, self.prefix = f"ktbr{tag}", f"kt{tag}-"  # interface names are <= 15 bytes
        self.api, self.log = (api_host, api_port), log
        self.pods = {}  # uid -> (ip, netns name, listener socket)
        self.lock = threading.Lock()
        self.cleanup()  # what a previous agent with this state dir left (e.g. it was SIGKILLed)
        self.subnet = self._free_subnet()
        hosts = self.subnet.hosts()
        self.gateway = next(hosts)
        self.host_ip = str(self.gateway)  # the node's address as its pods see it
        # No cluster DNS here, and the host's nameserver is off the machine: a pod's resolver
        # asks its own loopback (refused at once) after the hosts file.
        self.resolv_conf = os.path.join(state_dir, "resolv.conf")
        with open(self.resolv_conf, "w") as f:
            f.write("# kubetrain node agent: no cluster DNS; Service names are in /etc/hosts\n"
                    "nameserver 127.0.0.1\noptions ndots:1 timeout:1 attempts:1\n")
        # Round robin, as host-local IPAM: a released address goes to the back, so a new pod
        # never takes the address a pod just gave up (neighbour caches, lingering connections).
        self.free = collections.deque(hosts)
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        log(f"pod network: bridge {self.bridge} {self.gateway}/{self.subnet.prefixlen}, one network namespace"
            f" per pod; {API_SERVICE_IP}:{API_SERVICE_PORT} in each pod relays to {api_host}:{api_port}")

    def _free_subnet(self):
        routes = json.loads(_ip("-j", "route", "show", "table", "all").stdout or "[]")
        taken = []
        for r in routes:
            try:
                taken.append(ipaddress.ip_network(r.get("dst", ""), strict=False))
            except ValueError:
                pass  # "default", multicast names, ...
        for sub in POD_RANGE.subnets(new_prefix=20):
            if not any(sub.overlaps(t) for t in taken if t.prefixlen > 0):
                return sub
        raise RuntimeError(f"no free /20 in {POD_RANGE} for the pod network (all routed)")

    def netns(self, uid):
        return self.prefix + uid.replace("-", "")[:8]

    @staticmethod
    def veth(uid):
        return "ktv" + uid.replace("-", "")[:8]

    def add(self, uid):
        if not self.free:
            raise RuntimeError(f"no free pod IPs in {self.subnet}")
        ip, ns, veth = str(self.free.popleft()), self.netns(uid), self.veth(uid)
        try:
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{ip}/{self.subnet.prefixlen}", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{API_SERVICE_IP}/32", "dev", "lo")
            listener = self._listen_in(ns, (API_SERVICE_IP, API_SERVICE_PORT))
        except Exception:
            _ip("link", "del", veth, check=False)
            _ip("netns", "del", ns, check=False)
            self.free.append(ipaddress.ip_address(ip))
            raise
        with self.lock:
            self.pods[uid] = (ip, ns, listener)
        threading.Thread(target=self._relay_accept, args=(listener,), daemon=True).start()
        return ip

    def remove(self, uid, ip):
        with self.lock:
            entry = self.pods.pop(uid, None)
        if entry is None:
            return
        _, ns, listener = entry
        try:
            listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        listener.close()
        # The host's end first: a namespace outlives `ip netns del` while anything still holds it,
        # and its eth0 must not stay on the bridge with an address a new pod may get.
        _ip("link", "del", self.veth(uid), check=False)
        _ip("netns", "del", ns, check=False)
        self.free.append(ipaddress.ip_address(ip))

    def enter_argv(self, uid):
        return ["nsenter", f"--net=/run/netns/{self.netns(uid)}", "--"]

    def api_endpoint(self, api_host, api_port):
        return API_SERVICE_IP, API_SERVICE_PORT

    def close(self):
        with self.lock:
            pods = list(self.pods.items())
        for uid, (ip, _, _) in pods:
            self.remove(uid, ip)
        _ip("link", "del", self.bridge, check=False)

    def cleanup(self):
        for line in _ip("netns", "list", check=False).stdout.splitlines():
            name = line.split()[0] if line.split() else ""
            if name.startswith(self.prefix):
                _ip("netns", "del", name, check=False)
        _ip("link", "del", self.bridge, check=False)

    # --- the API server relay ------------------------------------------------------------
    @staticmethod
    def _listen_in(ns, addr):
        """A listening TCP socket inside network namespace NS. setns(2) changes only the
        calling thread's namespace, so a short-lived thread makes the socket; it keeps its
        namespace after the thread is gone."""
        out = {}

        def make():
            fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    e = ctypes.get_errno()
                    raise OSError(e, f"setns {ns}: {os.strerror(e)}")
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(addr)
                s.listen(64)
                out["sock"] = s
            except OSError as e:
                out["err"] = e
            finally:
                os.close(fd)

        t = threading.Thread(target=make)
        t.start()
        t.join()
        if "err" in out:
            raise RuntimeError(f"listening on {addr[0]}:{addr[1]} in {ns}: {out['err']}")
        return out["sock"]

    def _relay_accept(self, listener):
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # the pod is gone
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn):
        try:
            up = socket.create_connection(self.api, timeout=10)
            up.settimeout(None)
        except OSError as e:
            self.log(f"pod network: API relay to {self.api[0]}:{self.api[1]}: {e}")
            conn.close()
            return

        def pump(src, dst):
            how = socket.SHUT_WR  # a clean end of one direction half-closes the other side
            try:
                while True:
                    data = src.recv(65536)
                    if not data:
                        break
                    dst.sendall(data)
            except OSError:
                how = socket.SHUT_RDWR  # a reset: tear down both
            try:
                dst.shutdown(how)
            except OSError:
                pass

        other = threading.Thread(target=pump, args=(up, conn), daemon=True)
        other.start()
        pump(conn, up)
        other.join()
        conn.close()
        up.close()
