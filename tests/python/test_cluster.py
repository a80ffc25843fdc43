"""Strata as a Redis Cluster on etcd (issue 21, first steps): a real etcd on loopback, three
or more `strata` nodes joined to it, redis-py's RedisCluster and `redis-cli -c` routing
through -MOVED, `redis-cli --cluster check`, the reply shapes of the CLUSTER commands beside
a real three-node redis-server cluster, a node paused past its lease, etcd stopped, slot
moves while clients write, and the KV-cache pool across the nodes (groups, KVC.WHERE)."""

import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest
import redis
from redis.cluster import RedisCluster, ClusterNode
from redis.exceptions import ClusterDownError, MovedError, ResponseError

from conftest import StrataProcess, free_port, refusal, strata_bin
from strata_client import KVCacheClient, Namespace

pytestmark = pytest.mark.skipif(
    shutil.which("etcd") is None, reason="etcd is not installed (scripts/install-deps installs it)"
)

# Short leases so the tests that wait for one to lapse stay short.
LEASE_TTL_S = 3


class Etcd:
    """One etcd member on loopback; `stop` and `start` keep its data."""

    def __init__(self):
        self.dir = tempfile.TemporaryDirectory(prefix="strata-etcd-")
        self.port = free_port()
        self.peer_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None
        self.start()

    def start(self):
        self.log = open(os.path.join(self.dir.name, "etcd.log"), "ab")
        self.proc = subprocess.Popen(
            [
                "etcd",
                "--data-dir", os.path.join(self.dir.name, "data"),
                "--listen-client-urls", self.url,
                "--advertise-client-urls", self.url,
                "--listen-peer-urls", f"http://127.0.0.1:{self.peer_port}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_port}",
                "--initial-cluster", f"default=http://127.0.0.1:{self.peer_port}",
            ],
            stdout=self.log,
            stderr=self.log,
        )
        deadline = time.time() + 30
        while subprocess.run(
            ["etcdctl", "--endpoints", self.url, "endpoint", "health"],
            capture_output=True,
            env=dict(os.environ, ETCDCTL_API="3"),
        ).returncode != 0:
            assert self.proc.poll() is None, "etcd exited"
            assert time.time() < deadline, "etcd did not start"
            time.sleep(0.1)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def close(self):
        self.stop()
        self.dir.cleanup()


@pytest.fixture
def etcd():
    e = Etcd()
    yield e
    e.close()


def cluster_cmd(etcd, name, *args, check=True):
    return subprocess.run(
        [strata_bin(), "cluster", *args, "--etcd", etcd.url, "--name", name],
        capture_output=True,
        text=True,
        timeout=180,
        check=check,
    )


class StrataCluster:
    def __init__(self, etcd, n, name, extra=None):
        self.etcd, self.name, self.extra = etcd, name, extra or {}
        self.nodes = [self.add_node() for _ in range(n)]

    def add_node(self):
        return StrataProcess(
            {
                "cluster_etcd": f'"{self.etcd.url}"',
                "cluster_name": f'"{self.name}"',
                "cluster_lease_ttl_s": LEASE_TTL_S,
                **self.extra,
            }
        )

    def rebalance(self):
        r = cluster_cmd(self.etcd, self.name, "rebalance")
        return r.stdout + r.stderr

    def wait_served(self, nodes=None, timeout=30):
        """Until every node sees all slots served (the map reached them)."""
        deadline = time.time() + timeout
        for n in nodes or self.nodes:
            while n.client().cluster("info")["cluster_state"] != "ok":
                assert time.time() < deadline, "the slot map did not reach every node"
                time.sleep(0.1)

    def client(self, **kw):
        n = self.nodes[0]
        return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", n.port)], **kw)

    def stop(self):
        for n in self.nodes:
            n.stop()


@pytest.fixture
def cluster3(etcd):
    c = StrataCluster(etcd, 3, f"t{os.getpid()}{free_port()}")
    out = c.rebalance()
    assert "16384 slots over 3 nodes" in out, out
    c.wait_served()
    yield c
    c.stop()


def slot_owner_port(node_client, slot):
    for first, last, owner, *_ in node_client.execute_command("CLUSTER", "SLOTS"):
        if first <= slot <= last:
            return owner[1]
    return None


def test_redis_cluster_clients_read_and_write_through_redirections(cluster3):
    rc = cluster3.client()
    values = {f"user:{i}": os.urandom(40 + i % 50) for i in range(300)}
    for k, v in values.items():
        assert rc.set(k, v)
    for k, v in values.items():
        assert rc.get(k) == v, k
    # A pipeline and a multi-key read that span the nodes: redis-py splits them by slot.
    with rc.pipeline() as p:
        for i in range(50):
            p.incr(f"counter:{i}")
        assert p.execute() == [1] * 50
    keys = list(values)[:100]
    assert rc.mget_nonatomic(keys) == [values[k] for k in keys]
    # Hash tags keep keys in one slot: multi-key commands work there.
    assert rc.mset({"{feat:7}.a": "1", "{feat:7}.b": "2"})
    assert rc.execute_command("MGET", "{feat:7}.a", "{feat:7}.b") == [b"1", b"2"]

    # Every node holds exactly the keys of its own slots.
    raw = [n.client() for n in cluster3.nodes]
    total = 0
    for n, c in zip(cluster3.nodes, raw):
        total += c.dbsize()
        for k in list(values)[:60]:
            slot = c.execute_command("CLUSTER", "KEYSLOT", k)
            assert slot == rc.keyslot(k)
            owner = slot_owner_port(c, slot)
            if owner == n.port:
                assert c.get(k) == values[k]
                assert c.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) >= 1
                assert k.encode() in c.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
            else:
                with pytest.raises(MovedError, match=f"^{slot} 127.0.0.1:{owner}$"):
                    c.get(k)
    assert total == len(values) + 50 + 2

    # Refusals as Redis Cluster gives them.
    c = raw[0]
    with pytest.raises(redis.ResponseError, match="^Keys in request don't hash to the same slot$"):
        c.execute_command("MSET", "a", "1", "b", "2")
    with pytest.raises(redis.ResponseError, match="SELECT is not allowed in cluster mode"):
        c.execute_command("SELECT", "1")
    assert c.execute_command("SELECT", "0")
    ic = c.info("cluster")
    assert ic["cluster_enabled"] == 1 and ic["cluster_lease_live"] == 1
    assert ic["cluster_slots_served"] in (5461, 5462) and ic["cluster_slots_moving_out"] == 0
    assert c.execute_command("READONLY") and c.execute_command("READWRITE")
    # Scripts name their keys: all in one slot, served here.
    with pytest.raises(redis.ResponseError, match="^Keys in request don't hash to the same slot$"):
        c.eval("return 1", 2, "a", "b")
    local = next(f"s{i}" for i in range(1000) if slot_owner_port(c, rc.keyslot(f"s{i}")) == cluster3.nodes[0].port)
    remote = next(f"s{i}" for i in range(1000) if slot_owner_port(c, rc.keyslot(f"s{i}")) != cluster3.nodes[0].port)
    assert c.eval("return redis.call('SET', KEYS[1], 'v')", 1, local) == b"OK"
    with pytest.raises(redis.ResponseError, match="non local key"):
        c.eval(f"return redis.call('GET', '{remote}')", 1, local)
    # A transaction must stay in one slot.
    p = c.pipeline(transaction=True)
    p.set("{x}1", "a")
    p.set("{y}1", "b")
    with pytest.raises(redis.ResponseError):
        p.execute()
    # The KV-cache pool needs a group tag in a cluster: a group's chunks share its slot.
    with pytest.raises(redis.ResponseError, match="takes TAG"):
        c.execute_command("KVC.MATCH", "ns", "h1")


def test_redis_cli_follows_redirections_and_cluster_check_agrees(cluster3):
    port = str(cluster3.nodes[0].port)
    for i in range(20):
        out = subprocess.run(
            ["redis-cli", "-c", "-p", port, "SET", f"cli:{i}", f"v{i}"],
            capture_output=True, text=True, check=True,
        ).stdout
        assert out.strip() == "OK", out
    for i in range(20):
        out = subprocess.run(
            ["redis-cli", "-c", "-p", port, "GET", f"cli:{i}"],
            capture_output=True, text=True, check=True,
        ).stdout
        assert out.strip() == f"v{i}"
    check = subprocess.run(
        ["redis-cli", "--cluster", "check", f"127.0.0.1:{port}"],
        capture_output=True, text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "[OK] All nodes agree about slots configuration." in check.stdout, check.stdout
    assert "[OK] All 16384 slots covered." in check.stdout, check.stdout
    assert "[OK] 20 keys in 3 masters." in check.stdout, check.stdout
    status = cluster_cmd(cluster3.etcd, cluster3.name, "status").stdout
    assert status.count(" live, ") == 3, status


def port_with_bus():
    """A free port whose cluster bus port (port + 10000) is free too."""
    import random
    import socket

    while True:
        p = random.randint(20000, 45000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", p))
                b.bind(("127.0.0.1", p + 10000))
            return p
        except OSError:
            continue


class RedisServerCluster:
    """A real three-node redis-server cluster, made with `redis-cli --cluster create`."""

    def __init__(self):
        self.dir = tempfile.TemporaryDirectory(prefix="redis-cluster-")
        self.ports = [port_with_bus() for _ in range(3)]
        self.procs = []
        for p in self.ports:
            d = os.path.join(self.dir.name, str(p))
            os.mkdir(d)
            self.procs.append(subprocess.Popen(
                ["redis-server", "--port", str(p), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                 "--cluster-config-file", "nodes.conf", "--dir", d, "--save", "", "--appendonly", "no"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))
        for p in self.ports:
            deadline = time.time() + 20
            while True:
                try:
                    redis.Redis(port=p).ping()
                    break
                except redis.ConnectionError:
                    assert time.time() < deadline
                    time.sleep(0.05)
        subprocess.run(
            ["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in self.ports], "--cluster-yes"],
            capture_output=True, check=True, timeout=60,
        )
        deadline = time.time() + 30
        while any(redis.Redis(port=p).cluster("info")["cluster_state"] != "ok" for p in self.ports):
            assert time.time() < deadline, "the redis-server cluster did not converge"
            time.sleep(0.2)

    def stop(self):
        for p in self.procs:
            p.kill()
            p.wait()
        self.dir.cleanup()


def shape(x):
    """The type structure of a reply: what clients parse (an empty map and an empty array
    are the same bytes in RESP2, and redis-py gives either)."""
    if isinstance(x, dict) and not x:
        return []
    if isinstance(x, (list, tuple)):
        return [shape(e) for e in x]
    if isinstance(x, dict):
        return {k: shape(v) for k, v in x.items()}
    return type(x).__name__


def test_cluster_replies_have_the_shapes_of_a_real_redis_cluster(cluster3):
    ref = RedisServerCluster()
    try:
        s = cluster3.nodes[0].client()
        r = redis.Redis(port=ref.ports[0])
        raw = ["CLUSTER", "SLOTS"]
        ss, rs = s.execute_command(*raw), r.execute_command(*raw)
        assert [row[:2] for row in sorted(ss)] == [row[:2] for row in sorted(rs)], "the same split"
        assert shape(sorted(ss)[0]) == shape(sorted(rs)[0])
        ssh = s.execute_command("CLUSTER", "SHARDS")
        rsh = r.execute_command("CLUSTER", "SHARDS")
        assert len(ssh) == len(rsh) == 3
        by_first = lambda shards: sorted(shards, key=lambda sh: sh[b"slots"][0])
        for sh_s, sh_r in zip(by_first(ssh), by_first(rsh)):
            assert sh_s[b"slots"] == sh_r[b"slots"]
            assert set(sh_s) == set(sh_r) == {b"slots", b"nodes"}
            (n_s,), (n_r,) = sh_s[b"nodes"], sh_r[b"nodes"]
            assert set(n_s) == set(n_r), set(n_s) ^ set(n_r)
            assert shape(n_s) == shape(n_r)
            assert n_s[b"role"] == n_r[b"role"] == b"master"
            assert n_s[b"health"] == n_r[b"health"] == b"online"
        # CLUSTER NODES: as many fields per line, the same flags, a valid bus port.
        for line_s, line_r in zip(
            s.execute_command("CLUSTER", "NODES").decode().strip().splitlines(),
            r.execute_command("CLUSTER", "NODES").decode().strip().splitlines(),
        ):
            fs, fr = line_s.split(), line_r.split()
            assert len(fs) == len(fr) and len(fs[0]) == len(fr[0]) == 40
            addr, bus = fs[1].split("@")
            assert 0 < int(bus.split(",")[0]) < 65536
            assert fs[2].replace("myself,", "") == fr[2].replace("myself,", "") == "master"
            assert fs[7] == fr[7] == "connected"
        si, ri = s.cluster("info"), r.cluster("info")
        assert set(si) <= set(ri), set(si) - set(ri)
        assert si["cluster_state"] == ri["cluster_state"] == "ok"
        assert si["cluster_slots_assigned"] == ri["cluster_slots_assigned"] == "16384"
        assert si["cluster_known_nodes"] == ri["cluster_known_nodes"] == "3"
        for k in ["foo", "{user1000}.following", "123456789", ""]:
            assert s.execute_command("CLUSTER", "KEYSLOT", k) == r.execute_command("CLUSTER", "KEYSLOT", k)
        assert len(s.execute_command("CLUSTER", "MYID")) == len(r.execute_command("CLUSTER", "MYID")) == 40
        # The same refusals, word for word where clients match on them.
        for cmd in [("MSET", "a", "1", "b", "2"), ("SELECT", "1")]:
            errs = [refusal(c, *cmd) for c in (s, r)]
            assert errs[0] == errs[1], errs
        # A key the first node does not serve: MOVED with the slot.
        k = next(f"k{i}" for i in range(1000) if slot_owner_port(s, s.execute_command("CLUSTER", "KEYSLOT", f"k{i}")) != cluster3.nodes[0].port)
        with pytest.raises(MovedError, match=r"^\d+ 127\.0\.0\.1:\d+$"):
            s.get(k)
    finally:
        ref.stop()


def test_a_node_paused_past_its_lease_refuses_writes_and_its_slots_go_to_the_live_nodes(cluster3):
    rc = cluster3.client()
    for i in range(200):
        rc.set(f"k:{i}", f"v{i}")
    paused = cluster3.nodes[2]
    pc = paused.client(socket_timeout=10)
    pc.ping()
    os.kill(paused.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(LEASE_TTL_S + 3)
        # The live nodes took its slots.
        live = cluster3.nodes[:2]
        deadline = time.time() + 20
        while any(n.client().cluster("info")["cluster_known_nodes"] != "2" for n in live):
            assert time.time() < deadline, "the lost node's slots were not handed over"
            time.sleep(0.2)
        owners = {row[2][1] for row in live[0].client().execute_command("CLUSTER", "SLOTS")}
        assert owners == {n.port for n in live}
    finally:
        os.kill(paused.proc.pid, signal.SIGCONT)
    # Resumed, it accepts no write: it knows its lease may have lapsed, and once it has
    # registered again it redirects to the new owners.
    for i in range(50):
        try:
            pc.set(f"k:{i}", "stale")
            pytest.fail("a node paused past its lease accepted a write")
        except (ClusterDownError, MovedError):
            pass
    deadline = time.time() + 20
    while True:
        try:
            pc.set("k:0", "x")
            pytest.fail("the resumed node accepted a write for a slot it lost")
        except MovedError:
            break
        except ClusterDownError as e:
            assert time.time() < deadline, f"the resumed node never registered again: {e}"
            time.sleep(0.2)
    # Keys of the live nodes' own slots are all there; the lost node's are unavailable
    # (its data stays on its disk) until slot moves exist.
    rc2 = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", cluster3.nodes[0].port)])
    kept = sum(rc2.get(f"k:{i}") == f"v{i}".encode() for i in range(200))
    assert kept >= 100, kept
    assert all(rc2.get(f"k:{i}") != b"stale" for i in range(50))


@pytest.mark.parametrize("durability", ["group", "bucket"])
def test_etcd_down_shorter_than_the_lease_changes_nothing_longer_gives_clusterdown(etcd, tmp_path, durability):
    """Also with a shared bucket (issue 67): etcd back after every lease expired, the nodes
    take their slots again and serve what they held."""
    global LEASE_TTL_S
    shared = {"durability": durability, "cold_url": f'"file://{tmp_path}"'} if durability == "bucket" else {}
    c = StrataCluster(etcd, 2, f"e{os.getpid()}{free_port()}", shared)
    try:
        c.rebalance()
        c.wait_served()
        rc = c.client()
        etcd.stop()
        t0 = time.time()
        # Stable slots go on while etcd is down for less than the TTL.
        i = 0
        while time.time() - t0 < LEASE_TTL_S / 3:
            rc.set(f"during:{i}", i)
            assert rc.get(f"during:{i}") == str(i).encode()
            i += 1
        etcd.start()
        for j in range(i):
            assert rc.get(f"during:{j}") == str(j).encode()
        rc.set("after", "1")
        # Down longer than the TTL: the nodes refuse with CLUSTERDOWN until it returns.
        etcd.stop()
        time.sleep(LEASE_TTL_S + 1)
        raw = c.nodes[0].client()
        with pytest.raises(ClusterDownError, match="lost contact with etcd"):
            raw.set("{during:0}x", "1")
        assert raw.cluster("info")["cluster_state"] == "fail"
        etcd.start()
        deadline = time.time() + 30
        while True:
            try:
                rc2 = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", c.nodes[0].port)])
                rc2.set("back", "1")
                break
            except (redis.ResponseError, redis.exceptions.ClusterDownError, redis.ConnectionError) as e:
                assert time.time() < deadline, f"the cluster did not come back: {e}"
                time.sleep(0.3)
        assert rc2.get("after") == b"1"
        for j in range(i):
            assert rc2.get(f"during:{j}") == str(j).encode()
    finally:
        c.stop()


def test_a_node_added_then_one_removed_while_clients_write_loses_no_acknowledged_write(cluster3):
    import threading
    from redis.exceptions import AskError, TryAgainError

    stop = threading.Event()
    acked = {}
    raw_errors = []
    app_errors = []

    def cluster_writer():
        rc = cluster3.client()
        i = 0
        while not stop.is_set():
            k, v = f"w:{i}", os.urandom(24) + str(i).encode()
            try:
                rc.set(k, v)
                acked[k] = v
            except Exception as e:  # redis-py follows redirections itself; anything else is a failure
                app_errors.append(repr(e))
            i += 1

    def raw_writer():
        # One node, no client-side routing: every refusal must be a redirection.
        c = cluster3.nodes[0].client()
        i = 0
        while not stop.is_set():
            k, v = f"r:{i}", str(i).encode()
            try:
                c.set(k, v)
                acked[k] = v
            except (MovedError, AskError, TryAgainError):
                pass
            except Exception as e:
                raw_errors.append(repr(e))
            i += 1

    # Other kinds and TTLs move with their slots.
    rc0 = cluster3.client()
    for i in range(100):
        rc0.hset(f"h:{i}", mapping={"a": str(i), "b": "x" * i})
        rc0.set(f"t:{i}", "ttl", ex=1000)
        rc0.zadd(f"z:{i}", {"m": i})
    # A pin on one node goes with the slots it gives away.
    assert cluster3.nodes[1].client().execute_command("PIN", "h:*") >= 0
    threads = [threading.Thread(target=cluster_writer), threading.Thread(target=raw_writer)]
    for t in threads:
        t.start()
    try:
        time.sleep(1)
        cluster3.nodes.append(cluster3.add_node())
        new = cluster3.nodes[-1]
        out = cluster_cmd(cluster3.etcd, cluster3.name, "add-node", "--addr", f"127.0.0.1:{new.port}")
        assert "16384 slots over 4 nodes, 4096 to 4096 each" in out.stdout, out.stdout + out.stderr
        assert "slots moving" in out.stderr, "progress is shown"
        assert new.client().execute_command("PINS") == [b"h:*"]
        time.sleep(1)
        leaving = cluster3.nodes[1]
        out = cluster_cmd(cluster3.etcd, cluster3.name, "remove-node", "--addr", f"127.0.0.1:{leaving.port}")
        assert "holds no slots" in out.stdout and "over 3 nodes" in out.stdout, out.stdout + out.stderr
        time.sleep(1)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not app_errors, app_errors[:5]
    assert not raw_errors, raw_errors[:5]
    assert len(acked) > 500, len(acked)
    leaving.stop()
    cluster3.nodes.remove(leaving)
    cluster3.wait_served()
    rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", cluster3.nodes[0].port)])
    lost = [k for k, v in acked.items() if rc.get(k) != v]
    assert not lost, f"{len(lost)} acknowledged writes lost, e.g. {lost[:5]}"
    for i in range(100):
        assert rc.hgetall(f"h:{i}") == {b"a": str(i).encode(), b"b": b"x" * i}
        assert 900 < rc.ttl(f"t:{i}") <= 1000
        assert rc.zscore(f"z:{i}", "m") == i
    # The sources dropped their copies: the nodes hold each key once.
    total = sum(n.client().dbsize() for n in cluster3.nodes)
    assert total == len(acked) + 300, (total, len(acked))
    check = subprocess.run(
        ["redis-cli", "--cluster", "check", f"127.0.0.1:{cluster3.nodes[0].port}"],
        capture_output=True, text=True,
    )
    assert "[OK] All 16384 slots covered." in check.stdout, check.stdout
    assert "[OK] All nodes agree about slots configuration." in check.stdout, check.stdout


def test_the_cluster_benchmark_runs_and_writes_its_report(tmp_path):
    """`scripts/bench-cluster --quick` end to end (figures are not asserted: shared cores)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run(
        [os.path.join(root, "scripts", "bench-cluster"), "--quick", "--strata", strata_bin(), "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "bench-cluster: 3 Strata node(s)" in r.stderr, "progress is shown"
    import json
    rep = json.loads((tmp_path / "cluster.json").read_text())
    assert [(row["nodes"], row["test"]) for row in rep["rows"]] == [
        (n, t) for n in (1, 2, 3) for t in ("set", "get")
    ]
    assert all(row["strata"]["rps"] > 0 and row["redis"]["rps"] > 0 for row in rep["rows"])
    assert rep["move"]["keys_moved"] > 0 and rep["move"]["keys_after"] == rep["move"]["keys"]
    assert "| nodes | test | Strata ops/s | Redis ops/s |" in (tmp_path / "cluster.md").read_text()


def test_a_client_blocked_on_a_slot_that_moves_away_is_redirected(cluster3):
    import threading
    from redis.exceptions import TryAgainError

    node0 = cluster3.nodes[0]
    c = node0.client(socket_timeout=60)
    rc = cluster3.client()
    key = next(f"q{i}" for i in range(1000) if slot_owner_port(c, rc.keyslot(f"q{i}")) == node0.port)
    got = {}

    def blocked():
        t0 = time.time()
        try:
            got["reply"] = node0.client(socket_timeout=60).blpop(key, timeout=30)
        except (MovedError, TryAgainError) as e:
            got["error"] = type(e).__name__
        got["seconds"] = time.time() - t0

    t = threading.Thread(target=blocked)
    t.start()
    time.sleep(0.5)
    out = cluster_cmd(cluster3.etcd, cluster3.name, "remove-node", "--addr", f"127.0.0.1:{node0.port}")
    assert "holds no slots" in out.stdout, out.stdout + out.stderr
    t.join(timeout=30)
    assert not t.is_alive()
    assert got.get("error") in ("MovedError", "TryAgainError"), got
    assert got["seconds"] < 25, got
    # The queue works where the slot went, and nothing was popped on the old node.
    rc2 = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", cluster3.nodes[1].port)])
    rc2.rpush(key, "job")
    assert rc2.lpop(key) == b"job"



def test_kv_cache_chunks_of_one_group_tag_live_in_its_slot_and_are_redirected(cluster3, strata):
    raw = [n.client() for n in cluster3.nodes]
    rc = cluster3.client()
    tag = "g0a1b2c3d4e5f6a7"
    slot = rc.keyslot("{" + tag + "}")
    owner = next(c for c, n in zip(raw, cluster3.nodes) if slot_owner_port(c, slot) == n.port)
    other = next(c for c in raw if c is not owner)
    args = ["KVC.PUT", "ns1", "TAG", tag, "h1", b"v1", "h2", b"v2"]
    with pytest.raises(MovedError, match=f"^{slot} "):
        other.execute_command(*args)
    assert owner.execute_command(*args) == 2
    assert owner.execute_command("KVC.GET", "ns1", "TAG", tag, "h1", "h2", "h3") == [b"v1", b"v2"]
    count, tiers = owner.execute_command("KVC.MATCH", "ns1", "TAG", tag, "h1", "h2", "h3")
    assert count == 2 and len(tiers) == 2
    with pytest.raises(MovedError):
        other.execute_command("KVC.GET", "ns1", "TAG", tag, "h1")
    # The chunk keys carry the tag: plain commands find them in the same slot.
    key = "kvc:ns1:{" + tag + "}h1"
    assert rc.keyslot(key) == slot and rc.get(key) is not None
    # A single node takes the same tagged requests.
    one = strata.client()
    assert one.execute_command(*args) == 2
    assert one.execute_command("KVC.GET", "ns1", "TAG", tag, "h1", "h2") == [b"v1", b"v2"]
    assert one.execute_command("KVC.GET", "ns1", "h1") == [], "untagged keys are other keys"
    # Quotas are per node; `strata cluster status` sums each namespace over the live nodes.
    assert owner.execute_command("KVC.PUT", "nsq", "TAG", tag, "h1", b"abc", "h2", b"de") == 2
    owner.execute_command("KVC.QUOTA", "nsq", 1000)
    other.execute_command("KVC.QUOTA", "nsq", 500)
    status = cluster_cmd(cluster3.etcd, cluster3.name, "status").stdout
    assert "nsq 5 bytes in 2 chunks, quota 1500, 0 dropped for it" in status, status


def test_kv_cache_client_spreads_a_prefix_over_groups_and_any_node_says_where_it_is(cluster3, strata):
    """Chunks go in groups of kvc_group_chunks (16), each group under the hash of its first
    chunk: a 40-chunk prefix spans three slots, KVCacheClient splits its requests per group
    and node, and KVC.WHERE on any node finds the whole prefix, its nodes and tiers."""
    url = f"redis://127.0.0.1:{cluster3.nodes[0].port}"
    raw = {n.port: n.client() for n in cluster3.nodes}
    rc = cluster3.client()
    ns = Namespace("meta-llama/Llama-3.1-8B-Instruct", "main", "bf16", "vllm-paged", 1, 0, chunk_tokens=4)
    # A prompt whose three groups do not all live on one node.
    for start in range(0, 1000, 7):
        prompt = list(range(start, start + 40 * 4 + 2))
        hashes = ns.chunk_hashes(prompt)
        owners = [slot_owner_port(rc, rc.keyslot(hashes[g])) for g in (0, 16, 32)]
        if len(set(owners)) > 1:
            break
    c = KVCacheClient(url, ns, cluster=True)
    assert c.lookup(prompt) == 0
    chunks = [bytes([i]) * 1024 for i in range(40)]
    assert c.store(prompt, chunks) == 40
    # Every chunk is where the shared scheme says (tests/vectors), readable by plain GET.
    for key, value in zip(ns.grouped_keys(prompt), chunks):
        assert rc.get(key) == value
    assert c.lookup(prompt) == 160
    assert c.retrieve(prompt) == chunks
    assert c.tiers(prompt) == ["hot"] * 40
    # A prompt that shares 20 chunks reuses them across the first group boundary.
    other = prompt[:80] + [7] * 40
    assert c.lookup(other) == 80
    assert c.retrieve(other) == chunks[:20]
    # KVC.WHERE: the same answer from every node, with the nodes in chunk order.
    where = c.where(prompt)
    assert where["tokens"] == 160 and where["tiers"] == ["hot"] * 40, where
    want_nodes = []
    for g, o in zip((0, 16, 32), owners):
        n = min(16, 40 - g)
        if want_nodes and want_nodes[-1][0] == f"127.0.0.1:{o}":
            want_nodes[-1] = (want_nodes[-1][0], want_nodes[-1][1] + n)
        else:
            want_nodes.append((f"127.0.0.1:{o}", n))
    assert where["nodes"] == want_nodes, where
    for port, node in raw.items():
        count, load_us, nodes, tiers = node.execute_command("KVC.WHERE", ns.id, *hashes)
        assert count == 40 and load_us >= 0 and [(n.decode(), k) for n, k in nodes] == want_nodes, port
        by_tokens = node.execute_command("KVC.WHERE", "NAMESPACE", ns.canonical, "TOKENS", *other)
        assert by_tokens[0] == 20, port
    assert c.where(prompt[:3])["tokens"] == 0
    with pytest.raises(ResponseError, match="canonical"):
        raw[cluster3.nodes[0].port].execute_command("KVC.WHERE", "NAMESPACE", "nonsense", "TOKENS", 1)
    with pytest.raises(ResponseError, match="braces"):
        rc.execute_command("KVC.GET", ns.id, "TAG", "{x}", "h1")
    # Cluster clients find a KVC command's node from its tag (COMMAND GETKEYS).
    assert raw[cluster3.nodes[0].port].command_getkeys("KVC.GET", ns.id, "TAG", hashes[16], "h") == [hashes[16]]
    assert rc.execute_command("KVC.GET", ns.id, "TAG", hashes[16], hashes[16]) == [chunks[16]]
    # The node of the first group leaves: its slots move, the client's map is stale, and
    # the client follows the redirections and still finds everything.
    out = cluster_cmd(cluster3.etcd, cluster3.name, "remove-node", "--addr", f"127.0.0.1:{owners[0]}")
    assert "holds no slots" in out.stdout, out.stdout + out.stderr
    cluster3.wait_served([n for n in cluster3.nodes if n.port != owners[0]])
    assert slot_owner_port(rc, rc.keyslot(hashes[0])) != owners[0]
    assert c.lookup(prompt) == 160
    assert c.retrieve(prompt) == chunks
    assert c.where(prompt)["tokens"] == 160
    c.close()
    # A single node: untagged keys, and KVC.WHERE names it "myself".
    one = KVCacheClient(f"redis://127.0.0.1:{strata.port}", ns)
    assert one.store(prompt, chunks) == 40
    assert one.where(prompt) == {"tokens": 160, "load_us": one.where(prompt)["load_us"], "nodes": [("myself", 40)], "tiers": ["hot"] * 40}
    assert strata.client().execute_command("KVC.WHERE", ns.id, "GROUP", 16, *hashes)[0] == 0, "grouped keys are other keys"
    one.close()


def test_the_lmcache_connector_works_against_a_cluster(cluster3):
    """LMCache's connector against three nodes: each chunk its own group (LMCache's keys carry
    no position in the prompt), one pipeline per node, redirections followed when a node
    leaves."""
    import asyncio

    from strata_client.lmcache import StrataConnector

    keys = [f"meta-llama/Llama-3.1-8B@1@0@{i:x}@bfloat16" for i in range(60)]
    chunks = [(f"meta{i}".encode(), bytes([i]) * (2048 + i)) for i in range(60)]
    url = f"redis://127.0.0.1:{cluster3.nodes[0].port}"
    rc = cluster3.client()

    async def check(c, n):
        assert await c.batched_contains(keys) == n
        got = await c.batched_get(keys)
        assert [(m, bytes(kv)) for m, kv in got] == chunks[:n]

    async def run():
        c = StrataConnector(url, lease_ms=5000, cluster=True)
        assert await c.batched_contains(keys) == 0
        await c.batched_put(keys[:40], chunks[:40])
        await check(c, 40)
        # The chunks are spread over the nodes.
        ns = "meta-llama/Llama-3.1-8B@1@0@bfloat16"
        owners = {slot_owner_port(rc, rc.keyslot(f"{i:x}")) for i in range(40)}
        assert len(owners) == 3, owners
        assert rc.get(f"kvc:{ns}:{{5}}5") is not None
        assert await c.exists(keys[39]) and not await c.exists(keys[40])
        assert sorted(await c.list()) == sorted(keys[:40])
        assert await c.remove(keys[39]) and not await c.remove(keys[39])
        await check(c, 39)
        await c.put(keys[39], chunks[39])
        # A node leaves: its chunks move, the connector's map is stale, and it follows.
        leaving = cluster3.nodes[2]
        out = cluster_cmd(cluster3.etcd, cluster3.name, "remove-node", "--addr", f"127.0.0.1:{leaving.port}")
        assert "holds no slots" in out.stdout, out.stdout + out.stderr
        await check(c, 40)
        await c.batched_put(keys[40:], chunks[40:])
        await check(c, 60)
        await c.close()
        with pytest.raises(ValueError):
            StrataConnector(url, local=True, cluster=True)

    asyncio.run(run())


def retrying(f, seconds=60):
    """Runs `f` until it succeeds (a cluster client sees connection errors, CLUSTERDOWN and
    TRYAGAIN while a lost node's slots move); its last error after `seconds`."""
    deadline = time.time() + seconds
    while True:
        try:
            return f()
        except (redis.exceptions.RedisError, OSError):
            if time.time() > deadline:
                raise
            time.sleep(0.1)


def sharing_a_bucket(etcd, tmp_path, **extra):
    """A cluster's name, its bucket (a local directory) and the settings of nodes that share
    it with durability=bucket (and `extra`)."""
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    name = f"b{os.getpid()}{free_port()}"
    settings = {
        "cluster_etcd": f'"{etcd.url}"',
        "cluster_name": f'"{name}"',
        "cluster_lease_ttl_s": LEASE_TTL_S,
        "durability": "bucket",
        "cold_url": f'"file://{bucket}"',
        **extra,
    }
    return name, bucket, settings


def served(etcd, name, nodes):
    """Spreads the slots over `nodes` and waits until each sees them all served."""
    out = cluster_cmd(etcd, name, "rebalance").stdout
    assert f"16384 slots over {len(nodes)} nodes" in out, out
    c = StrataCluster.__new__(StrataCluster)
    c.nodes = nodes
    c.wait_served()
    return c


def test_a_node_killed_under_writes_loses_no_acknowledged_write_with_bucket_durability(etcd, tmp_path):
    """Issue 67: three nodes sharing a bucket (a local directory) with durability=bucket, a
    RedisCluster writer, one node SIGKILLed after the 2,000th acknowledged write while the
    writer goes on: every acknowledged write is served by the survivors with its bytes,
    those demoted to segments too; the killed node comes back and takes slots again. The
    logs are snapshotted as they grow (the objects a snapshot covers deleted), and once the
    survivors adopted the killed node's slots, what it wrote is deleted from the bucket."""
    # Small budgets: most keys reach the bucket's segments as well as its log.
    name, bucket, settings = sharing_a_bucket(
        etcd, tmp_path, warm_bytes_max=262144, warm_bytes_hard_max="64MiB",
        background_interval_ms=50, block_bytes=4096, bucket_snapshot_bytes_min="4KiB")
    dirs = [tmp_path / f"node{i}" for i in range(3)]
    nodes = [StrataProcess(settings, data_dir=str(d)) for d in dirs]
    try:
        c = served(etcd, name, nodes)
        rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", nodes[0].port)])
        acked = {}
        for i in range(6000):
            value = (f"{i:06d}:" * 74)[:512].encode()
            retrying(lambda: rc.set(f"k:{i}", value))
            acked[f"k:{i}"] = value
            if i == 1999:
                before = [e for e, files in epochs_holding(bucket).items() if files]
                nodes[2].proc.kill()
                nodes[2].proc.wait()
        # Every acknowledged write, from the two survivors.
        rc2 = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", nodes[0].port)])
        lost = [k for k, v in acked.items() if retrying(lambda: rc2.get(k)) != v]
        assert not lost, f"{len(lost)} of {len(acked)} acknowledged writes lost: {lost[:5]}"
        assert all(n.client().info("cluster")["cluster_slots_adopting"] == 0 for n in nodes[:2])
        assert "adopting" not in cluster_cmd(etcd, name, "status").stdout
        segments = list(bucket.glob("epochs/*/segments/*.seg"))
        assert segments, "no key reached a segment"
        assert list(bucket.glob("epochs/*/snapshots/*/*.log")), "no log was snapshotted"
        for log in bucket.glob("epochs/*/log"):
            first = min(log.glob("*.log"), default=None)
            assert first is None or first.name != f"{1:020}.log", f"{log} was never cut"
        # The killed node's epoch: adopted, then deleted but for its fence.
        assert len(before) == 3, before
        deadline = time.time() + 30
        while not fenced_only(bucket):
            assert time.time() < deadline, f"the lost node's epoch stays: {epochs_holding(bucket)}"
            time.sleep(0.2)
        # The killed node comes back, throws away what it held, and takes slots again.
        nodes[2] = StrataProcess(settings, data_dir=str(dirs[2]))
        out = cluster_cmd(etcd, name, "rebalance").stdout
        assert "16384 slots over 3 nodes" in out, out
        c.wait_served()
        owners = {row[2][1] for row in nodes[0].client().execute_command("CLUSTER", "SLOTS")}
        assert nodes[2].port in owners
        rc3 = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", nodes[2].port)])
        wrong = [k for k, v in acked.items() if retrying(lambda: rc3.get(k)) != v]
        assert not wrong, f"{len(wrong)} keys read back wrong after the rejoin: {wrong[:5]}"
    finally:
        for n in nodes:
            n.stop()


def epochs_holding(bucket):
    """The writer epochs of `bucket`, each with the objects it holds."""
    return {p.name: [f for f in p.rglob("*") if f.is_file()] for p in bucket.glob("epochs/*")}


def fenced_only(bucket):
    """The writer epochs of `bucket` that hold nothing but a fence (retired)."""
    return [
        e for e, files in epochs_holding(bucket).items()
        if len(files) == 1 and files[0].read_bytes()[:8] == b"STRFENCE"
    ]


def test_a_fenced_node_paused_past_its_lease_writes_nothing_its_slots_new_owners_read(etcd, tmp_path):
    """Issue 67: with a shared bucket, a node paused past its lease is fenced before its
    slots go to the live nodes; resumed, every write it is sent is refused, and its log in
    the bucket ends at the fence (no object of its epoch lies beyond it). Once its slots'
    new owners adopted it, its epoch holds the fence alone."""
    name, bucket, settings = sharing_a_bucket(etcd, tmp_path)
    nodes = [StrataProcess(settings) for _ in range(3)]
    try:
        served(etcd, name, nodes)
        rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", nodes[0].port)])
        for i in range(300):
            rc.set(f"k:{i}", f"v{i}")
        paused = nodes[2]
        pc = paused.client(socket_timeout=10)
        pc.ping()
        os.kill(paused.proc.pid, signal.SIGSTOP)
        try:
            deadline = time.time() + 30
            while any(n.client().cluster("info")["cluster_known_nodes"] != "2" for n in nodes[:2]):
                assert time.time() < deadline, "the lost node's slots were not handed over"
                time.sleep(0.2)
            rc2 = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", nodes[0].port)])
            assert all(retrying(lambda: rc2.get(f"k:{i}")) == f"v{i}".encode() for i in range(300))
        finally:
            os.kill(paused.proc.pid, signal.SIGCONT)
        for i in range(50):
            with pytest.raises(redis.exceptions.RedisError):
                pc.set(f"k:{i}", "stale")
        time.sleep(1)
        fences = 0
        for epoch in bucket.glob("epochs/*/log"):
            logs = sorted(epoch.glob("*.log"))
            fenced = [p for p in logs if p.read_bytes()[:8] == b"STRFENCE"]
            if fenced:
                fences += 1
                assert logs[-1] == fenced[0], f"objects beyond the fence in {epoch}"
        assert fences >= 1, "the lost node's log was not fenced"
        deadline = time.time() + 30
        while not fenced_only(bucket):
            assert time.time() < deadline, f"the lost node's epoch stays: {epochs_holding(bucket)}"
            time.sleep(0.2)
        rc3 = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", nodes[0].port)])
        assert all(retrying(lambda: rc3.get(f"k:{i}")) == f"v{i}".encode() for i in range(300))
    finally:
        for n in nodes:
            n.stop()


@pytest.mark.parametrize("killed", ["source", "target"])
def test_a_node_killed_during_a_slot_move_loses_no_acknowledged_write(etcd, tmp_path, killed):
    """Issue 67: two nodes sharing a bucket with durability=bucket, a third added and the
    slots moving to it slowly while a writer goes on; one end of the move (a source, or the
    new node) is SIGKILLed once it has handed some slots over and not others. The slots it
    was moving are adopted by whoever holds them next, from its log where its keys are the
    newest: every acknowledged write reads back."""
    # Slow moves: the kill lands in the middle of one.
    name, _, settings = sharing_a_bucket(etcd, tmp_path, cluster_move_bytes_per_s="64KiB")
    nodes = [StrataProcess(settings) for _ in range(2)]
    rebalance = None
    try:
        served(etcd, name, nodes)
        rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", nodes[0].port)])
        acked = {}

        def write(i):
            value = (f"{i:06d}:" * 74)[:512].encode()
            retrying(lambda: rc.set(f"k:{i}", value))
            acked[f"k:{i}"] = value

        for i in range(3000):
            write(i)
        nodes.append(StrataProcess(settings))
        rebalance = subprocess.Popen(
            [strata_bin(), "cluster", "rebalance", "--etcd", etcd.url, "--name", name],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # Write until the new node serves some slots, then kill one end of the move.
        i = 3000
        deadline = time.time() + 60
        while True:
            write(i)
            i += 1
            owners = {row[2][1] for row in nodes[0].client().execute_command("CLUSTER", "SLOTS")}
            if nodes[2].port in owners:
                break
            assert time.time() < deadline, "no slot reached the new node"
        moving = int(nodes[0].client().info("cluster").get("cluster_slots_moving_out", 0))
        moving += int(nodes[1].client().info("cluster").get("cluster_slots_moving_out", 0))
        assert moving > 0, "the move ended before the kill"
        victim = nodes[0] if killed == "source" else nodes[2]
        victim.proc.kill()
        victim.proc.wait()
        for j in range(i, i + 1000):
            write(j)
        survivor = nodes[1]
        rc2 = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", survivor.port)])
        lost = [k for k, v in acked.items() if retrying(lambda: rc2.get(k)) != v]
        seen = [(k, rc2.keyslot(k), (rc2.get(k) or b"")[:8]) for k in lost[:5]]
        slots = survivor.client().execute_command("CLUSTER", "SLOTS")
        if lost:
            for n in nodes:
                print("=== node", n.port)
                print(open(n.log.name).read()[-6000:])
        assert not lost, f"{len(lost)} of {len(acked)} acknowledged writes lost: {seen} {slots}"
    finally:
        if rebalance:
            rebalance.kill()
        for n in nodes:
            n.stop()


def test_wait_answers_one_once_the_bucket_log_holds_the_writes(tmp_path):
    """WAIT numreplicas timeout: the bucket log stands for a replica (1 once it holds the
    writes acknowledged before the call); a node that ships to no bucket answers 0, as a
    Redis without replicas does."""
    shipping = StrataProcess({"durability": "bucket", "cold_url": f'"file://{tmp_path}"'})
    plain = StrataProcess()
    try:
        for node, want in ((shipping, 1), (plain, 0)):
            c = node.client()
            c.set("k", "v")
            assert c.execute_command("WAIT", 1, 2000) == want
            assert c.execute_command("WAIT", 0, 0) == 0
            with pytest.raises(ResponseError, match="timeout is negative"):
                c.execute_command("WAIT", 1, -1)
        logs = list(tmp_path.glob("epochs/0000000000/log/*.log"))
        assert logs, "the shipping node wrote no log object"
    finally:
        shipping.stop()
        plain.stop()


def test_every_write_path_survives_a_sigkill_of_its_node_with_bucket_durability(etcd, tmp_path):
    """Issue 67: in `bucket` mode each write path (a SET, HSETs on a live hash, a hash stored
    as parts, a 1 MiB value, a script, a MULTI) is in the bucket log once acknowledged: the
    node that took them is SIGKILLed and the survivor serves every one with its bytes."""
    name, _, settings = sharing_a_bucket(etcd, tmp_path, parts_bytes_min="16KiB")
    nodes = [StrataProcess(settings) for _ in range(2)]
    try:
        served(etcd, name, nodes)
        victim, survivor = nodes
        owned = owned_slots(victim)
        rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", survivor.port)])
        tag = next(t for t in (f"t{i}" for i in range(10_000)) if rc.keyslot(f"{{{t}}}") in owned)
        k = lambda s: f"{{{tag}}}:{s}"
        v = victim.client()
        v.set(k("string"), b"\x00bytes\xff")
        for i in range(300):
            v.hset(k("live"), f"f{i % 50}", f"value-{i}")
        v.hset(k("parts"), mapping={f"field-{i:05d}": os.urandom(64) for i in range(1000)})
        v.hset(k("parts"), "field-00007", b"changed")
        big = os.urandom(1 << 20)
        v.set(k("big"), big)
        v.eval("redis.call('SET', KEYS[1], 'from-lua'); redis.call('RPUSH', KEYS[2], 'a', 'b')",
               2, k("lua"), k("list"))
        pipe = v.pipeline(transaction=True)
        pipe.incrby(k("counter"), 41).incr(k("counter")).sadd(k("set"), "x", "y").delete(k("string"))
        pipe.execute()
        want = {
            "live": v.hgetall(k("live")),
            "parts": v.hgetall(k("parts")),
            "lua": v.get(k("lua")),
            "list": v.lrange(k("list"), 0, -1),
            "counter": v.get(k("counter")),
            "set": v.smembers(k("set")),
        }
        assert len(want["parts"]) == 1000 and want["parts"][b"field-00007"] == b"changed"
        figures = v.info("strata")
        assert figures["live_writes"] >= 300 and figures["parts_written"] >= 1000, figures
        victim.proc.kill()
        victim.proc.wait()
        got = {
            "live": retrying(lambda: rc.hgetall(k("live"))),
            "parts": retrying(lambda: rc.hgetall(k("parts"))),
            "lua": retrying(lambda: rc.get(k("lua"))),
            "list": retrying(lambda: rc.lrange(k("list"), 0, -1)),
            "counter": retrying(lambda: rc.get(k("counter"))),
            "set": retrying(lambda: rc.smembers(k("set"))),
        }
        assert got == want
        assert retrying(lambda: rc.get(k("big"))) == big
        assert retrying(lambda: rc.exists(k("string"))) == 0, "a delete inside MULTI was lost"
        assert survivor.client().info("cluster")["cluster_slots_adopting"] == 0
    finally:
        for n in nodes:
            n.stop()


def owned_slots(node):
    """The slots `node` serves, by its own CLUSTER SLOTS."""
    out = set()
    for first, last, owner, *_ in node.client().execute_command("CLUSTER", "SLOTS"):
        if owner[1] == node.port:
            out.update(range(first, last + 1))
    return out


def test_with_group_durability_a_killed_node_loses_only_its_last_bucket_lag(etcd, tmp_path):
    """Issue 67: with durability=group the bucket log runs behind the replies, at most
    `bucket_lag_ms_max` behind: writes acknowledged well before a SIGKILL (here 3 s, against
    a lag of 200 ms) are all served by the survivors; only the last moment's may be gone."""
    name, _, settings = sharing_a_bucket(etcd, tmp_path, bucket_lag_ms_max=200)
    settings["durability"] = "group"
    nodes = [StrataProcess(settings) for _ in range(3)]
    try:
        served(etcd, name, nodes)
        rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", nodes[0].port)])
        pipe = rc.pipeline()
        for i in range(3000):
            pipe.set(f"old:{i}", f"v{i}")
        pipe.execute()
        time.sleep(3)
        for i in range(300):
            pipe.set(f"new:{i}", f"v{i}")
        pipe.execute()
        nodes[2].proc.kill()
        nodes[2].proc.wait()
        rc2 = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", nodes[0].port)])
        lost = [i for i in range(3000) if retrying(lambda: rc2.get(f"old:{i}")) != f"v{i}".encode()]
        assert not lost, f"{len(lost)} writes older than the bucket lag lost: {lost[:5]}"
    finally:
        for n in nodes:
            n.stop()


def test_a_node_that_takes_slots_over_announces_their_kv_chunks(etcd, tmp_path):
    """KV event feed in a cluster: chunks stored on one node, then a node added with a feed;
    the slots that move to it bring their chunks, and it announces them with their tokens."""
    import msgpack
    import zmq

    c = StrataCluster(etcd, 1, f"t{os.getpid()}{free_port()}")
    ctx = zmq.Context()
    try:
        c.rebalance()
        c.wait_served()
        ns = Namespace("meta-llama/Llama-3.1-8B-Instruct", "main", "bf16", "vllm-paged", 1, 0, chunk_tokens=16)
        kv = KVCacheClient(f"redis://127.0.0.1:{c.nodes[0].port}", ns, cluster=True)
        prompts = [list(range(p * 1000, p * 1000 + 16 * 20)) for p in range(8)]
        for p in prompts:
            kv.store(p, [b"c"] * 20)
        c.extra = {"kv_events_endpoint": f"ipc://{tmp_path}/kv-events"}
        c.nodes.append(c.add_node())
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.RCVTIMEO, 500)
        sub.connect(f"ipc://{tmp_path}/kv-events")
        time.sleep(0.3)
        out = cluster_cmd(etcd, c.name, "add-node", "--addr", f"127.0.0.1:{c.nodes[1].port}")
        assert "over 2 nodes" in out.stdout, out.stdout + out.stderr
        c.wait_served()
        mine = set(owned_slots(c.nodes[1]))
        rc = c.client()
        want = sorted(t for p in prompts for g, tag in enumerate(ns.chunk_hashes(p)[::16])
                      if rc.keyslot(tag) in mine for t in p[g * 256 : (g + 1) * 256])
        assert want, "some groups moved"
        got, deadline = [], time.time() + 20
        while len(got) < len(want) and time.time() < deadline:
            try:
                got += [t for e in msgpack.unpackb(sub.recv_multipart()[2])[1] for t in e[3]]
            except zmq.Again:
                pass
        assert sorted(got) == want
    finally:
        ctx.destroy(linger=0)
        c.stop()
