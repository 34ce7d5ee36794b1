"""A DCGM exporter for tests: dcgm-exporter's Prometheus text for chosen GPUs, served by a real HTTP server."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LABELS = 'UUID="GPU-{u}",device="nvidia{g}",modelName="NVIDIA H100 80GB HBM3",Hostname="n1",container="",pod=""'


def exposition(gpus, util=97.0, replay=None, xid=None, temp=None, throttle=None):
    """dcgm-exporter's text for `gpus` (indices), with optional per-GPU overrides (dicts gpu -> value)."""
    lines = []
    fields = [("DCGM_FI_DEV_GPU_UTIL", "gauge", lambda g: util),
              ("DCGM_FI_DEV_FB_USED", "gauge", lambda g: 40000),
              ("DCGM_FI_DEV_GPU_TEMP", "gauge", lambda g: (temp or {}).get(g, 60)),
              ("DCGM_FI_DEV_POWER_USAGE", "gauge", lambda g: 650.5),
              ("DCGM_FI_PROF_NVLINK_TX_BYTES", "gauge", lambda g: 2.5e9),
              ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", lambda g: 0),
              ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", lambda g: (replay or {}).get(g, 0)),
              ("DCGM_FI_DEV_XID_ERRORS", "gauge", lambda g: (xid or {}).get(g, 0)),
              ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", lambda g: (throttle or {}).get(g, 0))]
    for name, kind, value in fields:
        lines += [f"# HELP {name} a DCGM field.", f"# TYPE {name} {kind}"]
        lines += [f'{name}{{gpu="{g}",{LABELS.format(u=g, g=g)}}} {value(g)}' for g in gpus]
    # a MIG instance series and a series without a gpu label: both ignored
    lines.append('DCGM_FI_DEV_GPU_UTIL{gpu="0",GPU_I_ID="1",GPU_I_PROFILE="1g.10gb"} 3')
    lines.append("DCGM_FI_DEV_GPU_UTIL 5")
    return "\n".join(lines) + "\n"


class Exporter:
    def __init__(self, text):
        self.text, self.status = text, 200
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = exporter.text.encode()
                self.send_response(exporter.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
