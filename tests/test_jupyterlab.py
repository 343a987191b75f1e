"""The README's `jupyter lab` command opens, and a notebook runs through it as a user would run it: a headless
JupyterLab server is started, a notebook session is opened on notebooks/train.ipynb (its kernel starts in
notebooks/, no chdir into the repository), and every code cell is executed over the kernel's websocket at smoke
size. Its figure must come back inline (image/png)."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
TOKEN = uuid.uuid4().hex


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    lab = Path(sys.executable).with_name("jupyter-lab")
    proc = subprocess.Popen([str(lab), "--no-browser", "--allow-root", f"--port={port}", "--ip=127.0.0.1",
                             f"--ServerApp.token={TOKEN}", f"--ServerApp.root_dir={ROOT}"],
                            env={**os.environ, "DPPO_SMOKE": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{base}/api/status?token={TOKEN}", timeout=2)
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
                time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _api(base: str, path: str, body: dict | None = None, method: str = "GET") -> dict:
    req = urllib.request.Request(f"{base}{path}?token={TOKEN}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"{}")


async def _execute(base: str, kernel_id: str, cells: list[str]) -> list[dict]:
    """Run each cell in order on the kernel (Jupyter messaging protocol over the server's websocket); the iopub
    messages of all cells. Stops at the first cell whose reply is not ok."""
    from tornado.websocket import websocket_connect

    ws = await websocket_connect(f"{base.replace('http', 'ws')}/api/kernels/{kernel_id}/channels?token={TOKEN}")
    session, outputs = uuid.uuid4().hex, []
    for code in cells:
        msg_id = uuid.uuid4().hex
        await ws.write_message(json.dumps({
            "header": {"msg_id": msg_id, "username": "test", "session": session, "msg_type": "execute_request",
                       "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True}}))
        replied = idle = False  # the shell reply and the iopub outputs come on two channels, in either order:
        while not (replied and idle):  # a cell is done when both its reply and its iopub 'idle' status arrived
            msg = json.loads(await asyncio.wait_for(ws.read_message(), timeout=300))
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["channel"] == "iopub":
                outputs.append(msg)
                idle = idle or (msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle")
            if msg["msg_type"] == "execute_reply":
                assert msg["content"]["status"] == "ok", (code[:200], msg["content"])
                replied = True
    ws.close()
    return outputs


def test_jupyterlab_opens_and_runs_a_notebook_from_notebooks_dir(server):
    with urllib.request.urlopen(f"{server}/lab?token={TOKEN}", timeout=30) as r:
        assert r.status == 200 and b"JupyterLab" in r.read()
    nb = "notebooks/train.ipynb"
    session = _api(server, "/api/sessions", {"path": nb, "type": "notebook", "name": "train.ipynb",
                                              "kernel": {"name": "python3"}}, "POST")
    kernel = session["kernel"]["id"]
    cells = [c.source for c in nbformat.read(ROOT / nb, as_version=4).cells if c.cell_type == "code"]
    cells.insert(0, "import os; print('cwd', os.getcwd())")
    try:
        outputs = asyncio.run(_execute(server, kernel, cells))
    finally:
        _api(server, f"/api/sessions/{session['id']}", method="DELETE")
    text = "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")
    assert f"cwd {ROOT / 'notebooks'}" in text  # the kernel runs where the notebook is, not at the repository root
    assert not [m for m in outputs if m["msg_type"] == "error"]
    assert any("image/png" in m["content"].get("data", {}) for m in outputs if m["msg_type"] == "display_data"), \
        "the notebook's figure is not shown inline"
