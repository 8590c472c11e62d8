"""A real etcd server (Debian's etcd-server, which scripts/deps.sh
installs) on loopback for tests, as internal/etcdtest/etcdtest.go runs
one: a single member on free ports with a temporary data directory,
killed at the end."""

import base64
import http.client
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import unittest

ETCD = shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd") else None)


def free_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return "127.0.0.1:%d" % s.getsockname()[1]


class Server:
    """One etcd process; start() skips the test when etcd is not installed."""

    def __init__(self):
        if ETCD is None:
            raise unittest.SkipTest("etcd is not installed (Debian package etcd-server; scripts/deps.sh "
                                    "installs it): skipping the tests against a real etcd")
        self.dir = tempfile.mkdtemp(prefix="tf-etcd-")
        self.log_path = os.path.join(self.dir, "etcd.log")
        self.proc = None
        # A port found free may be taken by another process before etcd
        # binds it: etcd then exits at once, and runs again on others.
        for attempt in range(1, 6):
            self.client, self.peer = free_address(), free_address()
            self.url = "http://" + self.client
            self.data = os.path.join(self.dir, "data%d" % attempt)
            if self._run():
                return
            with open(self.log_path, "rb") as f:
                if b"address already in use" not in f.read():
                    break
        self.close()
        raise RuntimeError("etcd did not start: see %s" % self.log_path)

    def _run(self):
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                [ETCD, "--name", "test", "--data-dir", self.data,
                 "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                 "--listen-peer-urls", "http://" + self.peer,
                 "--initial-advertise-peer-urls", "http://" + self.peer,
                 "--initial-cluster", "test=http://" + self.peer,
                 "--heartbeat-interval", "20", "--election-timeout", "200"],
                stdout=log, stderr=log)
        finally:
            log.close()
        end = time.monotonic() + 30
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                self.proc = None
                return False
            try:
                c = http.client.HTTPConnection(*self.client.split(":"), timeout=2)
                c.request("GET", "/health")
                r = c.getresponse()
                ok = r.status == 200 and json.loads(r.read()).get("health") == "true"
                c.close()
                if ok:
                    return True
            except (OSError, ValueError, http.client.HTTPException):
                pass
            time.sleep(0.02)  # polls a process that gives no event to wait on
        self.kill()
        return False

    def kill(self):
        """SIGKILL: no goodbye to its clients."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def restart(self):
        """Run etcd again on the same data directory and ports after kill."""
        if not self._run():
            raise RuntimeError("etcd did not restart: see %s" % self.log_path)

    def close(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def do(self, path, body):
        c = http.client.HTTPConnection(*self.client.split(":"), timeout=5)
        try:
            c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            r = c.getresponse()
            b = r.read()
            if r.status != 200:
                raise RuntimeError("etcd %s: %d %s" % (path, r.status, b[:500]))
            return json.loads(b)
        finally:
            c.close()

    def put(self, key, value):
        """Write key = value with no lease, as anyone who may write under the prefix could."""
        return self.do("/v3/kv/put", {"key": base64.b64encode(key.encode()).decode(),
                                      "value": base64.b64encode(value).decode()})

    def delete(self, key):
        return self.do("/v3/kv/deleterange", {"key": base64.b64encode(key.encode()).decode()})

    def get(self, key):
        """The value of key, or None."""
        r = self.do("/v3/kv/range", {"key": base64.b64encode(key.encode()).decode()})
        kvs = r.get("kvs") or []
        return base64.b64decode(kvs[0].get("value", "")) if kvs else None
