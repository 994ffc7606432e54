"""Unit tests of tests/cluster/netpolicy.py's ruleset builder: no root, no cluster.

Run: python3 -m pytest -q tests/cluster/test_netpolicy.py
The rules in action (nft in each pod's network namespace, the operator's policy) are shown by
tests/operator/test_networkpolicy.py.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netpolicy  # noqa: E402
from netpolicy import Pod  # noqa: E402

NODE = "10.244.0.1"
PS = Pod("ps", "10.244.0.2", "default", {"kubetrain.io/job-name": "a", "kubetrain.io/replica-type": "ps"},
         [{"name": "grpc", "containerPort": 2222}, {"name": "dns", "containerPort": 53, "protocol": "UDP"}])
WORKER = Pod("w", "10.244.0.3", "default", {"kubetrain.io/job-name": "a", "kubetrain.io/replica-type": "worker"}, [])
OTHER = Pod("other", "10.244.0.4", "default", {"kubetrain.io/job-name": "b"}, [])
STRAY = Pod("stray", "10.244.0.5", "tools", {"app": "debug"}, [])
PODS = [PS, WORKER, OTHER, STRAY]
NAMESPACES = {"default": {"kubernetes.io/metadata.name": "default"},
              "tools": {"kubernetes.io/metadata.name": "tools", "team": "ml"}}


def policy(name, spec, ns="default"):
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}


# The operator's policy (operator/desired_auth.cc BuildNetworkPolicy) for job "a".
SAME_JOB = {"matchLabels": {"kubetrain.io/job-name": "a"}}
OPERATOR = policy("a", {"podSelector": SAME_JOB, "policyTypes": ["Ingress"],
                        "ingress": [{"from": [{"podSelector": SAME_JOB}]},
                                    {"ports": [{"protocol": "TCP", "port": 9090}]}]})


def rules(script):
    """The accept/drop lines of a pod's chain, without the fixed head and comments."""
    out = []
    for line in script.splitlines():
        line = line.strip().split(" comment ")[0]
        if line.endswith("accept") or line.endswith("drop"):
            out.append(line)
    return out


FIXED = ["ct state established,related accept", 'iif "lo" accept', f"ip saddr {NODE} accept"]


def test_a_pod_no_policy_selects_has_no_table_default_allow():
    out = netpolicy.build([OPERATOR], PODS, NAMESPACES, NODE)
    for uid in ("other", "stray"):
        assert out[uid] == "table inet kubetrain_netpol {}\ndelete table inet kubetrain_netpol\n", out[uid]
        assert rules(out[uid]) == []


def test_the_operators_policy_admits_the_job_on_any_port_and_anyone_on_the_metrics_port():
    out = netpolicy.build([OPERATOR], PODS, NAMESPACES, NODE)
    assert rules(out["ps"]) == FIXED + ["ip saddr { 10.244.0.2, 10.244.0.3 } accept", "tcp dport 9090 accept",
                                        "counter drop"]
    assert rules(out["w"]) == rules(out["ps"])  # the policy selects every pod of the job
    assert 'comment "default/a ingress[0]"' in out["ps"] and 'selected by default/a' in out["ps"]
    # The script replaces whatever table was there in one transaction, with an input hook.
    assert out["ps"].startswith("table inet kubetrain_netpol {}\ndelete table inet kubetrain_netpol\n")
    assert "type filter hook input priority filter; policy accept;" in out["ps"]


def test_match_expressions_in_notin_exists_doesnotexist():
    m = netpolicy.selector_matches
    labels = {"a": "1", "b": "2"}
    assert m({}, labels) and m({}, {})
    assert m({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "3"]}]}, labels)
    assert not m({"matchExpressions": [{"key": "a", "operator": "In", "values": ["3"]}]}, labels)
    assert not m({"matchExpressions": [{"key": "z", "operator": "In", "values": ["1"]}]}, labels)
    assert m({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["3"]}]}, labels)
    assert m({"matchExpressions": [{"key": "z", "operator": "NotIn", "values": ["3"]}]}, labels)  # absent key
    assert not m({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, labels)
    assert m({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, labels)
    assert not m({"matchExpressions": [{"key": "z", "operator": "Exists"}]}, labels)
    assert m({"matchExpressions": [{"key": "z", "operator": "DoesNotExist"}]}, labels)
    assert not m({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, labels)
    assert not m({"matchExpressions": [{"key": "a", "operator": "Bogus"}]}, labels)  # fails closed
    both = {"matchLabels": {"b": "2"}, "matchExpressions": [{"key": "a", "operator": "Exists"}]}
    assert m(both, labels) and not m(both, {"a": "1"})


def test_pod_selector_with_expressions_picks_sources_in_the_policys_namespace_only():
    pol = policy("p", {"podSelector": {"matchExpressions": [{"key": "kubetrain.io/replica-type", "operator": "In",
                                                             "values": ["ps"]}]},
                       "ingress": [{"from": [{"podSelector": {"matchExpressions": [
                           {"key": "kubetrain.io/job-name", "operator": "NotIn", "values": ["a"]}]}}]}]})
    out = netpolicy.build([pol], PODS, NAMESPACES, NODE)
    # OTHER is in default and not job a; STRAY (tools) is not in the policy's namespace.
    assert rules(out["ps"]) == FIXED + ["ip saddr { 10.244.0.4 } accept", "counter drop"]
    assert rules(out["w"]) == []  # a worker: not selected


def test_namespace_selector_alone_and_with_a_pod_selector():
    by_ns = policy("ns", {"podSelector": SAME_JOB,
                          "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "ml"}}}]}]})
    assert rules(netpolicy.build([by_ns], PODS, NAMESPACES, NODE)["ps"]) == FIXED + [
        "ip saddr { 10.244.0.5 } accept", "counter drop"]
    # Both in one peer: pods matching the podSelector in namespaces matching the namespaceSelector.
    both = policy("both", {"podSelector": SAME_JOB, "ingress": [{"from": [
        {"namespaceSelector": {}, "podSelector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]}}]}]})
    assert rules(netpolicy.build([both], PODS, NAMESPACES, NODE)["ps"]) == FIXED + [
        "ip saddr { 10.244.0.5 } accept", "counter drop"]
    # A namespace the agent has not seen yet still has its name label, as the API server sets it.
    named = policy("named", {"podSelector": SAME_JOB, "ingress": [{"from": [{"namespaceSelector": {
        "matchLabels": {"kubernetes.io/metadata.name": "tools"}}}]}]})
    assert rules(netpolicy.build([named], PODS, {}, NODE)["ps"]) == FIXED + [
        "ip saddr { 10.244.0.5 } accept", "counter drop"]


def test_ports_numeric_named_ranges_protocols():
    pol = policy("p", {"podSelector": SAME_JOB, "ingress": [{"ports": [
        {"port": 2222}, {"protocol": "UDP", "port": "dns"}, {"port": "grpc"}, {"port": "missing"},
        {"protocol": "TCP", "port": 8000, "endPort": 8010}, {"protocol": "SCTP"}, {"protocol": "UDP", "port": "grpc"}]}]})
    out = netpolicy.build([pol], PODS, NAMESPACES, NODE)
    assert rules(out["ps"]) == FIXED + ["tcp dport 2222 accept", "udp dport 53 accept", "tcp dport 2222 accept",
                                        "tcp dport 8000-8010 accept", "meta l4proto sctp accept", "counter drop"]
    # The worker declares no named ports: those entries admit nothing there.
    assert rules(out["w"]) == FIXED + ["tcp dport 2222 accept", "tcp dport 8000-8010 accept",
                                       "meta l4proto sctp accept", "counter drop"]


def test_sources_times_ports_and_ip_blocks():
    pol = policy("p", {"podSelector": SAME_JOB, "ingress": [{
        "from": [{"podSelector": {"matchLabels": {"kubetrain.io/job-name": "b"}}},
                 {"ipBlock": {"cidr": "10.244.0.0/24", "except": ["10.244.0.4/32", "10.244.0.5/32"]}}],
        "ports": [{"port": 2222}, {"protocol": "UDP", "port": 9999}]}]})
    assert rules(netpolicy.build([pol], PODS, NAMESPACES, NODE)["ps"]) == FIXED + [
        "ip saddr { 10.244.0.4 } tcp dport 2222 accept", "ip saddr { 10.244.0.4 } udp dport 9999 accept",
        "ip saddr 10.244.0.0/24 ip saddr != { 10.244.0.4/32, 10.244.0.5/32 } tcp dport 2222 accept",
        "ip saddr 10.244.0.0/24 ip saddr != { 10.244.0.4/32, 10.244.0.5/32 } udp dport 9999 accept",
        "counter drop"]


def test_no_ingress_rules_or_sources_that_match_nobody_admit_nothing():
    deny = policy("deny", {"podSelector": {}, "policyTypes": ["Ingress"]})
    out = netpolicy.build([deny], PODS, NAMESPACES, NODE)
    assert rules(out["ps"]) == rules(out["other"]) == FIXED + ["counter drop"]
    assert rules(out["stray"]) == []  # another namespace
    nobody = policy("nobody", {"podSelector": SAME_JOB, "ingress": [{"from": [
        {"podSelector": {"matchLabels": {"app": "none"}}}]}]})
    assert rules(netpolicy.build([nobody], PODS, NAMESPACES, NODE)["ps"]) == FIXED + ["counter drop"]


def test_egress_only_policies_select_nothing_for_ingress():
    egress = policy("e", {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]})
    assert rules(netpolicy.build([egress], PODS, NAMESPACES, NODE)["ps"]) == []
    # policyTypes absent: Ingress (even with egress rules).
    implied = policy("i", {"podSelector": {}, "egress": [{}]})
    assert rules(netpolicy.build([implied], PODS, NAMESPACES, NODE)["ps"]) == FIXED + ["counter drop"]


def test_several_policies_selecting_a_pod_admit_their_union():
    extra = policy("debug", {"podSelector": {"matchLabels": {"kubetrain.io/replica-type": "ps"}},
                             "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "ml"}},
                                                    "podSelector": {"matchLabels": {"app": "debug"}}}],
                                          "ports": [{"port": 2222}]}]})
    out = netpolicy.build([OPERATOR, extra], PODS, NAMESPACES, NODE)
    assert rules(out["ps"]) == FIXED + ["ip saddr { 10.244.0.2, 10.244.0.3 } accept", "tcp dport 9090 accept",
                                        "ip saddr { 10.244.0.5 } tcp dport 2222 accept", "counter drop"]
    assert "selected by default/a, default/debug" in out["ps"]
    assert rules(out["w"]) == FIXED + ["ip saddr { 10.244.0.2, 10.244.0.3 } accept", "tcp dport 9090 accept",
                                       "counter drop"]  # only the operator's policy selects it
    # The same input in another order gives the same scripts (the agent compares them).
    assert netpolicy.build([extra, OPERATOR], PODS[::-1], NAMESPACES, NODE) == out


def test_pods_come_and_go_from_the_source_sets():
    w2 = Pod("w2", "10.244.0.12", "default", {"kubetrain.io/job-name": "a"}, [])
    out = netpolicy.build([OPERATOR], PODS + [w2], NAMESPACES, NODE)
    assert "ip saddr { 10.244.0.2, 10.244.0.3, 10.244.0.12 } accept" in rules(out["ps"])  # numeric order
    no_ip = Pod("w3", "", "default", {"kubetrain.io/job-name": "a"}, [])
    out = netpolicy.build([OPERATOR], [PS, no_ip], NAMESPACES, NODE)
    assert "ip saddr { 10.244.0.2 } accept" in rules(out["ps"])


def test_pod_of_takes_labels_and_container_ports_from_the_object():
    obj = {"metadata": {"uid": "u", "namespace": "n", "labels": {"x": "y"}},
           "spec": {"containers": [{"name": "a", "ports": [{"name": "grpc", "containerPort": 2222}]},
                                   {"name": "b"}]}}
    assert netpolicy.pod_of(obj, "10.244.0.9") == Pod("u", "10.244.0.9", "n", {"x": "y"},
                                                      [{"name": "grpc", "containerPort": 2222}])
