"""NetworkPolicy ingress enforcement for the test node agent (tests/cluster/node_agent.py).

Test infrastructure, not a production CNI: it does for the agent's pods what a CNI plugin's
policy engine does for ingress, so tests can show that a policy admits what it should and
refuses what it should. Each pod has its own network namespace (pod_network.NetnsNetwork);
every pod some NetworkPolicy selects for Ingress gets an nftables table in that namespace:

    table inet kubetrain_netpol / chain ingress (hook input, policy accept):
      ct state established,related accept      replies to the pod's own connections
      iif "lo" accept                          the pod's own localhost
      ip saddr NODE accept                     the node (Kubernetes: always allowed)
      <one accept per source x port of every ingress rule of every policy selecting it>
      counter drop                             anything else, IPv6 included

A pod no policy selects has no table (default allow). Supported: podSelector and
namespaceSelector (matchLabels, matchExpressions In/NotIn/Exists/DoesNotExist), both in one
peer, ipBlock (cidr, except), ports (numeric, named ports of the destination pod's containers,
endPort ranges, protocol TCP/UDP/SCTP), policyTypes (absent: Ingress). Egress rules are not
enforced. Source pods are the agent's own pods (it is single-node).

`build` is a pure function of (policies, pods, namespaces, node IP) -> {pod uid: nft script};
`Enforcer` is the thin apply step the agent calls (watch events in, `nft -f -` per changed pod).
Needs nft (Debian package nftables) and root for the apply step. Python 3.11 stdlib only.
"""
import collections, json, shutil, subprocess

TABLE = "kubetrain_netpol"
NS_NAME_LABEL = "kubernetes.io/metadata.name"  # the API server sets it on every namespace
PROTOCOLS = {"TCP": "tcp", "UDP": "udp", "SCTP": "sctp"}

# One pod as the enforcer sees it: labels from metadata, ports from its containers' `ports`.
Pod = collections.namedtuple("Pod", "uid ip namespace labels ports")


def pod_of(obj, ip):
    md = obj["metadata"]
    ports = [p for c in (obj.get("spec") or {}).get("containers") or [] for p in c.get("ports") or []]
    return Pod(md["uid"], ip, md["namespace"], md.get("labels") or {}, ports)


def selector_matches(sel, labels):
    """A metav1.LabelSelector: {} matches everything; an unknown operator matches nothing."""
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in sel.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        if op == "In":
            ok = key in labels and labels[key] in values
        elif op == "NotIn":
            ok = key not in labels or labels[key] not in values
        elif op == "Exists":
            ok = key in labels
        elif op == "DoesNotExist":
            ok = key not in labels
        else:
            ok = False
        if not ok:
            return False
    return True


def is_ingress_policy(spec):
    return "Ingress" in (spec.get("policyTypes") or ["Ingress"])


def _sources(peers, policy_ns, pods, namespaces):
    """nft source matches for a rule's `from`: [""] (anyone) when it has none, else one match
    for the selected pods' IPs (if any) and one per ipBlock."""
    if not peers:
        return [""]
    ips, out = set(), []
    ns_labels = lambda ns: namespaces.get(ns) or {NS_NAME_LABEL: ns}
    for peer in peers:
        if "ipBlock" in peer:
            block = peer["ipBlock"]
            m = f"ip saddr {block['cidr']}"
            if block.get("except"):
                m += " ip saddr != { " + ", ".join(block["except"]) + " }"
            out.append(m)
            continue
        pod_sel, ns_sel = peer.get("podSelector"), peer.get("namespaceSelector")
        if pod_sel is None and ns_sel is None:
            continue  # an empty peer is invalid (the API server refuses it)
        for p in pods:
            in_ns = selector_matches(ns_sel, ns_labels(p.namespace)) if ns_sel is not None \
                else p.namespace == policy_ns
            if p.ip and in_ns and selector_matches(pod_sel or {}, p.labels):
                ips.add(p.ip)
    if ips:
        out.insert(0, "ip saddr { " + ", ".join(sorted(ips, key=_ip_key)) + " }")
    return out


def _ip_key(ip):
    return tuple(int(x) for x in ip.split(".")) if ip.count(".") == 3 else (999, ip)


def _ports(ports, pod):
    """nft port matches for a rule's `ports` on destination POD: [""] (any) when it has none;
    a named port the pod does not declare matches nothing."""
    if not ports:
        return [""]
    out = []
    for p in ports:
        proto = p.get("protocol", "TCP")
        nft = PROTOCOLS.get(proto)
        port = p.get("port")
        if nft is None:
            continue
        if port is None:
            out.append(f"meta l4proto {nft}")
            continue
        if isinstance(port, str) and not port.isdigit():
            port = next((c["containerPort"] for c in pod.ports
                         if c.get("name") == port and c.get("protocol", "TCP") == proto), None)
            if port is None:
                continue
        end = p.get("endPort")
        out.append(f"{nft} dport {int(port)}-{int(end)}" if end else f"{nft} dport {int(port)}")
    return out


def pod_ruleset(pod, policies, pods, namespaces, node_ip):
    """The nft script for one pod: its table when some policy selects it, else none (deleted)."""
    head = f"table inet {TABLE} {{}}\ndelete table inet {TABLE}\n"  # idempotent: create, drop, redo
    selecting = [pol for pol in policies if _selects(pol, pod, namespaces)]
    if not selecting:
        return head
    rules = ["ct state established,related accept", 'iif "lo" accept',
             f'ip saddr {node_ip} accept comment "the node"']
    for pol in selecting:
        md, spec = pol["metadata"], pol.get("spec") or {}
        for i, rule in enumerate(spec.get("ingress") or []):
            tag = f'comment "{md["namespace"]}/{md["name"]} ingress[{i}]"'
            for src in _sources(rule.get("from"), md["namespace"], pods, namespaces):
                for port in _ports(rule.get("ports"), pod):
                    rules.append(" ".join(x for x in (src, port, "accept", tag) if x))
    names = ", ".join(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in selecting)
    rules.append(f'counter drop comment "selected by {names}"')
    body = "".join(f"    {r}\n" for r in rules)
    return (head + f"table inet {TABLE} {{\n  chain ingress {{\n"
            "    type filter hook input priority filter; policy accept;\n" + body + "  }\n}\n")


def _selects(pol, pod, namespaces):
    md, spec = pol["metadata"], pol.get("spec") or {}
    return md.get("namespace") == pod.namespace and is_ingress_policy(spec) \
        and selector_matches(spec.get("podSelector") or {}, pod.labels)


def build(policies, pods, namespaces, node_ip):
    """{pod uid: nft script} for every pod. policies: NetworkPolicy objects; pods: Pod tuples;
    namespaces: {name: labels}; node_ip: the node's address on the pod network."""
    policies = sorted(policies, key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]))
    return {p.uid: pod_ruleset(p, policies, pods, namespaces, node_ip) for p in pods}


class Enforcer:
    """The apply step: keeps policies and namespace labels from the agent's watches and, each
    agent tick, re-runs `build` when anything changed and loads the changed scripts into their
    pods' namespaces with `nft -f -` (before a new pod's containers start)."""

    def __init__(self, net, log):
        self.net, self.log = net, log
        self.enabled = getattr(net, "mode", "") == "netns"
        self.policies, self.namespaces = {}, {}
        self.applied, self.last_input, self.last_error = {}, None, None
        if not self.enabled:
            log("network policy: not enforced (pod network mode loopback: no per-pod namespace)")
        elif not shutil.which("nft"):
            self.enabled = False
            log("network policy: NOT ENFORCED: nft not found (apt-get install nftables)")

    def on_event(self, kind, typ, obj):
        store = self.policies if kind == "networkpolicies" else self.namespaces
        value = (lambda o: o) if kind == "networkpolicies" else (lambda o: o["metadata"].get("labels") or {})
        key = lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"])
        if typ == "SYNC":
            store.clear()
            store.update({key(o): value(o) for o in obj})
        elif typ == "DELETED":
            store.pop(key(obj), None)
        else:
            store[key(obj)] = value(obj)

    def sync(self, runs):
        if not self.enabled:
            return
        with self.net.lock:
            live = set(self.net.pods)
        pods = [pod_of(r.pod, r.ip) for r in runs if r.uid in live]
        namespaces = {name: labels for (_, name), labels in self.namespaces.items()}
        key = json.dumps([sorted(self.policies.items()), namespaces, pods], sort_keys=True, default=str)
        if key == self.last_input:
            return
        self.last_input = key
        for uid in list(self.applied):
            if uid not in live:
                del self.applied[uid]  # its namespace is gone, and the table with it
        for uid, script in build(self.policies.values(), pods, namespaces, self.net.host_ip).items():
            if self.applied.get(uid) == script:
                continue
            ns = self.net.netns(uid)
            p = subprocess.run(["nsenter", f"--net=/run/netns/{ns}", "--", "nft", "-f", "-"], input=script,
                               capture_output=True, text=True)
            if p.returncode != 0:
                if p.stderr != self.last_error:
                    self.log(f"network policy: nft in {ns} failed (retrying): {p.stderr.strip()}")
                self.last_error = p.stderr
                self.applied.pop(uid, None)
                self.last_input = None  # retried next tick
                continue
            was = self.applied.get(uid)
            self.applied[uid] = script
            selected = "counter drop" in script
            if selected or (was and "counter drop" in was):
                self.log(f"network policy: {ns} {'ingress rules updated' if selected else 'open (no policy)'}")
