"""`litellm-1` and `litellm-N` (N workers): LiteLLM's proxy (`litellm --config`, uvicorn
workers) in a virtualenv of its own under .bench-peers/litellm, routing the upstream's
model to the upstream as an OpenAI-compatible provider.

Installed as `litellm==VERSION` plus the proxy's dependencies named one by one
(REQUIREMENTS): its `proxy` extra cannot be installed, since it names
`litellm-proxy==VERSION` and pins `litellm-proxy-extras==0.4.114.post1` and
`litellm-enterprise==0.1.83.post1`, none of which the registry serves. Every version is
pinned by locks/litellm-constraints.txt (the freeze of the install that worked).

Run with `LITELLM_LOCAL_MODEL_COST_MAP=True` (no fetch of the cost map at start), a master
key random per run (in the environment only: never argv, never the config file), no
database, `LITELLM_LOG=ERROR` (LiteLLM's logger and uvicorn's, its access log included)
and spend logs off. What it does per request: DOES.
"""

from __future__ import annotations

import itertools
import os
import secrets
import subprocess
from pathlib import Path
from typing import Final

import yaml

from sluicegate.testing import free_ports

from .peer import CACHE, UPSTREAM_KEY, RunningPeer, Upstream
from .processes import start_server, stop_session, tree

VERSION: Final = "1.110.2"
REQUIREMENTS: Final = (
    f"litellm=={VERSION}",
    "websockets",
    "granian",
    "fastapi",
    "starlette",
    "rq",
    "hiredis",
    "fastapi-sso",
    "pynacl",
    "mcp",
    "httpx2",
    "litellm-enterprise",
    "litellm-proxy-extras",
    "semver",
    "expression",
    "soundfile",
    "uvicorn",
    "uvloop",
    "backoff",
    "orjson",
    "apscheduler",
    "gunicorn",
    "python-multipart",
    "cryptography",
    "pyjwt",
    "email-validator",
)
CONSTRAINTS: Final = Path(__file__).resolve().parent / "locks" / "litellm-constraints.txt"
HOME: Final = CACHE / "litellm"
VENV: Final = HOME / "venv"
# What the venv was made from: an install whose marker differs is redone.
MARKER: Final = HOME / "installed.txt"
DOES: Final = (
    "checks the master key (no database: no virtual keys, budgets or limits, which need "
    "Postgres); parses the body, calls the upstream through its `openai/` provider and "
    "re-serialises the answer or every chunk; still on: the proxy hooks it registers for "
    "every request (the in-memory parallel-request limiter, with no limit for the master "
    "key, the cache-control check and the other built-in ones that need no database), its "
    "per-request logging object with its success handlers and service logger (no callback "
    "configured); spend logs off, log level ERROR (no access log)"
)


def _marker_text() -> str:
    return "\n".join([*REQUIREMENTS, CONSTRAINTS.read_text()])


class LitellmProxy:
    def __init__(self, work: Path, *, workers: int = 1) -> None:
        self.name = f"litellm-{workers}"
        self.does = DOES
        self.work = work
        self.workers = workers
        self._runs = itertools.count(1)

    def install(self) -> None:
        if MARKER.exists() and MARKER.read_text() == _marker_text():
            return
        print(f"installing into {VENV}: {' '.join(REQUIREMENTS)} (constraints {CONSTRAINTS.name})",
              flush=True)  # fmt: skip
        HOME.mkdir(parents=True, exist_ok=True)
        MARKER.unlink(missing_ok=True)
        if not (VENV / "bin" / "python").exists():
            subprocess.run(["python3", "-m", "venv", str(VENV)], check=True)
        pip = [str(VENV / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
        log = HOME / "install.log"
        with log.open("w") as out:
            done = subprocess.run(
                [*pip, "install", "--progress-bar", "off", "-c", str(CONSTRAINTS), *REQUIREMENTS],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        lines = log.read_text(errors="replace").splitlines()
        if done.returncode != 0:
            raise RuntimeError(f"pip install failed ({log}):\n" + "\n".join(lines[-30:]))
        print(*[line for line in lines if line.startswith("Successfully installed")], sep="\n")
        freeze = subprocess.run([*pip, "freeze"], check=True, capture_output=True, text=True)
        (HOME / "freeze.txt").write_text(freeze.stdout)
        MARKER.write_text(_marker_text())

    def version(self) -> str:
        python = subprocess.run(
            [str(VENV / "bin" / "python"), "-c",
             "import importlib.metadata as m, platform; "
             "print(m.version('litellm'), platform.python_version())"],
            check=True, capture_output=True, text=True,
        ).stdout.split()  # fmt: skip
        return f"LiteLLM {python[0]} (Python {python[1]}), uvicorn --num_workers {self.workers}"

    def start(self, upstream: Upstream) -> RunningPeer:
        work = self.work / f"{self.name}-{next(self._runs)}"
        work.mkdir(parents=True)
        config = work / "config.yaml"
        model = {
            "model_name": upstream.model,
            "litellm_params": {
                "model": f"openai/{upstream.model}",
                "api_base": upstream.api_base,
                "api_key": UPSTREAM_KEY,
            },
        }
        settings = {"model_list": [model], "general_settings": {"disable_spend_logs": True}}
        config.write_text(yaml.safe_dump(settings, sort_keys=False))
        key = "sk-" + secrets.token_hex(24)
        env = {
            **os.environ,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_MASTER_KEY": key,
            "LITELLM_LOG": "ERROR",
        }
        (port,) = free_ports(1)
        argv = [str(VENV / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1",
                "--port", str(port), "--num_workers", str(self.workers)]  # fmt: skip
        log_path = work / "litellm.log"
        url = f"http://127.0.0.1:{port}"
        headers = {"authorization": f"Bearer {key}"}
        process = start_server(argv, log_path, f"{url}/v1/models", cwd=work, env=env,
                               headers=headers)  # fmt: skip

        def stop() -> None:
            stop_session(process)

        return RunningPeer(self.name, url, upstream.model, lambda: tree(process.pid), stop,
                           headers)  # fmt: skip
