"""A warm ``beliefscope`` for the pages' blocks: fork a pre-imported interpreter for every command.

Each ``beliefscope`` process spends about 8 s of a 2-core CPU importing torch, transformers and
TransformerLens before it reads its arguments, and the pages run some forty commands. ``serve`` imports
the command line and those libraries once (no tensor op runs, so no thread pool exists to break a
fork), then forks one child per request. The child takes the caller's stdin, stdout and stderr (passed
over a Unix socket), its argv, working folder and environment, runs ``beliefscope.cli.main`` as the
console script does (or, for ``-c CODE``, the code as ``__main__``), and sends back its exit status.
Every command starts from the same fresh start-up state, a forked copy of it; the console script itself
is run by tests/test_wheel.py.

``python -S forked_cli.py ARGS...`` is the client (``BELIEFSCOPE_FORKED_CLI`` names the socket): the
``beliefscope`` on the pages' PATH (see `shim`) and the runner of their python blocks.
"""

import json
import os
import signal
import socket
import sys

SOCKET = "BELIEFSCOPE_FORKED_CLI"  # environment variable: the server's socket path


def _preload():
    """Import what the pages' commands import before their first forward: the parser (every command's
    module), the loaders and the model classes of the shipped checkpoints and SmolLM2."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot
    import sklearn.linear_model  # noqa: F401
    import transformer_lens.model_bridge  # noqa: F401
    from transformers.models.gpt2 import modeling_gpt2  # noqa: F401
    from transformers.models.llama import modeling_llama  # noqa: F401

    import beliefscope.models.load  # noqa: F401
    from beliefscope.cli import build_parser

    build_parser()


def _read_request(conn: socket.socket) -> tuple[dict, list[int]]:
    head, fds, _, _ = socket.recv_fds(conn, 8, 3)
    size, data = int.from_bytes(head, "big"), b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError("the client hung up mid-request")
        data += chunk
    return json.loads(data), fds


def _fresh_seeds() -> None:
    """A fresh interpreter seeds torch, numpy and `random` from the OS: so does each child (not the parent's state)."""
    import random

    import numpy as np
    import torch

    torch.seed()
    np.random.seed()
    random.seed()


def _run_child(conn: socket.socket) -> int:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the server ignores it (to reap); a command may wait on its own
    req, fds = _read_request(conn)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.argv = req["argv"]
    _fresh_seeds()
    status = 0
    try:
        if req["argv"][1:2] == ["-c"]:
            exec(compile(req["argv"][2], "<string>", "exec"), {"__name__": "__main__"})
        else:
            from beliefscope.cli import main

            status = main(req["argv"][1:])
    except SystemExit as e:
        if isinstance(e.code, int) or e.code is None:
            status = e.code or 0
        else:  # sys.exit("message"): printed, status 1
            print(e.code, file=sys.stderr)
            status = 1
    except BaseException:  # a traceback on stderr and status 1, as a fresh interpreter gives
        import traceback

        traceback.print_exc()
        status = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    conn.sendall(int(status).to_bytes(4, "big", signed=True))
    return int(status)


def serve(path: str) -> None:
    """Preload, then fork a child per connection until killed."""
    sys.path[0] = os.path.dirname(sys.executable)  # as the console script has it: not this folder
    _preload()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        if os.fork() == 0:
            server.close()
            code = 1
            try:
                code = _run_child(conn)
            finally:
                os._exit(code & 0xFF)
        conn.close()


def client(argv: list[str]) -> int:
    """Send this process's argv, folder, environment and stdin/stdout/stderr; return the command's status."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(os.environ[SOCKET])
    data = json.dumps({"argv": ["beliefscope", *argv], "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    socket.send_fds(conn, [len(data).to_bytes(8, "big")], [0, 1, 2])
    conn.sendall(data)
    got = b""
    while len(got) < 4 and (chunk := conn.recv(4 - len(got))):
        got += chunk
    if len(got) < 4:
        print("forked_cli: the command's process ended without a status (killed?)", file=sys.stderr)
        return 70
    return int.from_bytes(got, "big", signed=True)


def shim(folder: str) -> str:
    """Write ``folder/beliefscope``, a client for the server; return the folder (to put first on PATH)."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "beliefscope")
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\nexec "{sys.executable}" -S "{os.path.abspath(__file__)}" "$@"\n')
    os.chmod(path, 0o755)
    return folder


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2])
    else:
        sys.exit(client(sys.argv[1:]))
