"""Engine stand-in: plays vLLM or SGLang against a Mooncake store, with the real Mooncake client.

It reads the store settings exactly where each engine reads them:
  vLLM    `--kv-transfer-config` names the connector; the client document is the JSON file at
          `MOONCAKE_CONFIG_PATH` (keys master_server_address, metadata_server, protocol,
          device_name, global_segment_size, local_buffer_size, tenant_id).
  SGLang  `--hicache-storage-backend mooncake`; the client settings are the environment
          (MOONCAKE_MASTER, MOONCAKE_TE_META_DATA_SERVER, MOONCAKE_PROTOCOL, MOONCAKE_DEVICE,
          MOONCAKE_GLOBAL_SEGMENT_SIZE, MOONCAKE_LOCAL_HOSTNAME, MOONCAKE_TENANT_ID).
At start it puts one block (again each second for up to STANDIN_RETRY_SECONDS, 60 by default,
while the store refuses it: a store that is still coming up answers with quota or space errors)
and reads it back, logging every answer of the store, then serves:
  /health                 200 once the client is set up (a real engine stays healthy when
                          writes fail)
  /put?key=K&size=N       puts N bytes under K, answers {"rc": code}
  /get?key=K              {"exist": code, "bytes": n}; exist 0 is the store's own miss
  /metrics                the store-operation counters (Prometheus text)
Without a connector (vLLM with no `--kv-transfer-config`, SGLang with no
`--hicache-storage-backend`) it runs as the engine would, without the shared cache: /health
answers, /put and /get answer 409. A connector named with a setting it needs missing ends it with
exit code 2 and a line saying which.
"""

import http.server
import json
import os
import socket
import sys
import threading
import time

from mooncake.store import MooncakeDistributedStore

COUNTERS = {"put_ok": 0, "put_failed": 0, "get_hit": 0, "get_miss": 0, "get_failed": 0}
LOCK = threading.Lock()


def log(message):
    print(f"standin: {message}", flush=True)


def fail(message):
    print(f"standin: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def flags(argv):
    """--flag value, --flag=value and vLLM's --flag_name spelling; returns (flags, positionals)."""
    found, positional, i = {}, [], 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            name, eq, value = a[2:].partition("=")
            name = name.replace("_", "-")
            if eq:
                found[name] = value
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                found[name] = argv[i + 1]
                i += 1
            else:
                found[name] = ""
        else:
            positional.append(a)
        i += 1
    return found, positional


def pod_address():
    return os.environ.get("POD_IP") or socket.gethostbyname(socket.gethostname())


def vllm_settings(argv):
    found, _ = flags(argv)
    transfer = found.get("kv-transfer-config")
    if transfer is None:
        return no_cache("vllm", found, 8000)
    try:
        connector = json.loads(transfer).get("kv_connector")
    except (ValueError, AttributeError) as e:
        fail(f"--kv-transfer-config is not a JSON object: {e}")
    if connector != "MooncakeStoreConnector":
        fail(f"--kv-transfer-config names connector {connector!r}, not MooncakeStoreConnector")
    path = os.environ.get("MOONCAKE_CONFIG_PATH")
    if not path:
        fail("MOONCAKE_CONFIG_PATH is not set: MooncakeStoreConnector reads its client document there")
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"cannot read the client document at MOONCAKE_CONFIG_PATH={path}: {e}")
    if not doc.get("master_server_address"):
        fail(f"the client document at {path} has no master_server_address")
    return {
        "engine": "vllm",
        "port": int(found.get("port") or 8000),
        "master": doc["master_server_address"],
        "metadata": doc.get("metadata_server", "P2PHANDSHAKE"),
        "protocol": doc.get("protocol", "tcp"),
        "device": doc.get("device_name", ""),
        "segment": int(doc.get("global_segment_size", 0)),
        "buffer": int(doc.get("local_buffer_size", 16 << 20)),
        "tenant": doc.get("tenant_id"),
        "hostname": doc.get("local_hostname") or pod_address(),
    }


def sglang_settings(argv):
    found, _ = flags(argv)
    backend = found.get("hicache-storage-backend")
    if backend is None:
        return no_cache("sglang", found, 30000)
    if backend != "mooncake":
        fail(f"--hicache-storage-backend is {backend!r}, not mooncake: SGLang does not use the store")
    master = os.environ.get("MOONCAKE_MASTER")
    if not master:
        fail("MOONCAKE_MASTER is not set: SGLang's Mooncake backend reads the master address there")
    return {
        "engine": "sglang",
        "port": int(found.get("port") or 30000),
        "master": master,
        "metadata": os.environ.get("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
        "protocol": os.environ.get("MOONCAKE_PROTOCOL", "tcp"),
        "device": os.environ.get("MOONCAKE_DEVICE", ""),
        "segment": int(os.environ.get("MOONCAKE_GLOBAL_SEGMENT_SIZE", "0")),
        "buffer": 16 << 20,
        "tenant": os.environ.get("MOONCAKE_TENANT_ID"),
        "hostname": os.environ.get("MOONCAKE_LOCAL_HOSTNAME") or pod_address(),
    }


def no_cache(engine, found, port):
    """An engine started without a KV connector: it serves, and nothing reaches a store."""
    return {"engine": engine, "port": int(found.get("port") or port), "master": None}


def connect(s):
    store = MooncakeDistributedStore()
    config = {
        "local_hostname": s["hostname"],
        "metadata_server": s["metadata"],
        "global_segment_size": s["segment"],
        "local_buffer_size": s["buffer"],
        "protocol": s["protocol"],
        "rdma_devices": s["device"],
        "master_server_addr": s["master"],
    }
    if s["tenant"]:
        config["tenant_id"] = s["tenant"]
    try:
        rc = store.setup(config)
    except TypeError:
        # Clients before the dictionary form (0.3.11 and older) take positional settings and
        # know no tenants.
        if s["tenant"]:
            log(f"this client knows no tenants; tenant {s['tenant']} is not passed")
        rc = store.setup(
            s["hostname"], s["metadata"], s["segment"], s["buffer"], s["protocol"], s["device"], s["master"]
        )
    return store, rc


def put(store, key, size):
    rc = store.put(key, bytes([7]) * size)
    with LOCK:
        COUNTERS["put_ok" if rc == 0 else "put_failed"] += 1
    log(f"put key={key} bytes={size} rc={rc}")
    return rc


def get(store, key):
    exist = store.is_exist(key)
    n = len(store.get(key)) if exist > 0 else 0
    with LOCK:
        COUNTERS["get_hit" if exist > 0 else "get_miss" if exist == 0 else "get_failed"] += 1
    log(f"get key={key} exist={exist} bytes={n}")
    return exist, n


def serve(store, port):
    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self, code, body, kind="application/json"):
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            from urllib.parse import parse_qs, urlparse

            url = urlparse(self.path)
            q = {k: v[0] for k, v in parse_qs(url.query).items()}
            if url.path == "/health":
                self.answer(200, "{}")
            elif store is None and url.path in ("/put", "/get"):
                self.answer(409, json.dumps({"error": "no KV connector: this engine runs without the shared cache"}))
            elif url.path == "/put" and "key" in q:
                rc = put(store, q["key"], int(q.get("size", "4096")))
                self.answer(200, json.dumps({"rc": rc}))
            elif url.path == "/get" and "key" in q:
                exist, n = get(store, q["key"])
                self.answer(200, json.dumps({"exist": exist, "bytes": n}))
            elif url.path == "/metrics":
                with LOCK:
                    c = dict(COUNTERS)
                text = (
                    "# TYPE standin_store_puts_total counter\n"
                    f'standin_store_puts_total{{result="ok"}} {c["put_ok"]}\n'
                    f'standin_store_puts_total{{result="failed"}} {c["put_failed"]}\n'
                    "# TYPE standin_store_gets_total counter\n"
                    f'standin_store_gets_total{{result="hit"}} {c["get_hit"]}\n'
                    f'standin_store_gets_total{{result="miss"}} {c["get_miss"]}\n'
                    f'standin_store_gets_total{{result="failed"}} {c["get_failed"]}\n'
                )
                self.answer(200, text, "text/plain; version=0.0.4")
            else:
                self.answer(404, json.dumps({"error": f"no such path {url.path}"}))

        def log_message(self, *_):
            pass

    http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()


def main(engine, argv):
    s = vllm_settings(argv) if engine == "vllm" else sglang_settings(argv)
    if s["master"] is None:
        log(f"{s['engine']}: no KV connector configured: serving without the shared cache")
        log(f"serving /health on port {s['port']}")
        serve(None, s["port"])
        return
    tenant = s["tenant"] or "(the store's default)"
    log(f"{s['engine']}: master {s['master']} protocol {s['protocol']} tenant {tenant} from {s['hostname']}")
    store, rc = connect(s)
    if rc != 0:
        fail(f"the Mooncake client could not set up against {s['master']}: code {rc}")
    log("client set up")
    key = f"standin/{socket.gethostname()}/boot"
    size = int(os.environ.get("STANDIN_BLOCK_BYTES", str(1 << 20)))
    deadline = time.monotonic() + float(os.environ.get("STANDIN_RETRY_SECONDS", "60"))
    while put(store, key, size) != 0 and time.monotonic() < deadline:
        time.sleep(1)
    get(store, key)
    log(f"serving /health on port {s['port']}")
    serve(store, s["port"])


def run(engine):
    """Entry point of the `vllm`, `sglang` and `python -m sglang.launch_server` wrappers."""
    args = sys.argv[1:]
    main(engine, args[1:] if args[:1] == ["serve"] else args)
