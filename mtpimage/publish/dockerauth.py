"""Docker's stored registry credentials, read the way the docker CLI stores them, so registry
look-ups (is this image already published? which digest?) work on private registries
after a plain `docker login`.

Where they come from, in docker's order:
  1. `credHelpers[HOST]` in the config: `docker-credential-<helper> get` is asked for HOST;
  2. `auths[HOST]` with an inline `auth` (base64 user:password) or `username`/`password`;
  3. `credsStore` (the default helper), asked the same way as 1.
The config is $DOCKER_CONFIG/config.json, else ~/.docker/config.json. docker.io's entry is
keyed `https://index.docker.io/v1/`. An `identitytoken` (an OAuth refresh token) is not
exchanged for an access token here: that registry's look-ups go unauthenticated, and say
`docker login` when refused. Credentials are never logged or put in an error message.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from mtpimage import children
from mtpimage.imageref import DOCKER_HUB

HUB_KEY = "https://index.docker.io/v1/"


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str

    def __repr__(self) -> str:  # never print a secret by accident
        return f"Credentials(username={self.username!r}, password=***)"


def config_path() -> Path:
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"


def _read_config() -> dict:
    try:
        data = json.loads(config_path().read_text())
    except (OSError, ValueError):
        return {}  # no login at all, or a file docker itself would reject
    return data if isinstance(data, dict) else {}


def _keys(host: str) -> list[str]:
    """The `auths` keys docker may have written for `host`."""
    if host in (DOCKER_HUB, "index.docker.io", "registry-1.docker.io"):
        return [HUB_KEY, "index.docker.io", DOCKER_HUB, "https://index.docker.io/v1"]
    return [host, f"https://{host}", f"http://{host}", f"https://{host}/v1/", f"https://{host}/v2/"]


def _from_entry(entry) -> Credentials | None:
    if not isinstance(entry, dict):
        return None
    if entry.get("auth"):
        try:
            user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        return Credentials(user, password) if user else None
    if entry.get("username") and entry.get("password"):
        return Credentials(entry["username"], entry["password"])
    return None


def _from_helper(helper: str, server: str) -> Credentials | None:
    try:
        proc = children.run(
            [f"docker-credential-{helper}", "get"], input=server, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None  # helper not installed or hung: as if not logged in
    if proc.returncode != 0:
        return None
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        return None
    user, secret = data.get("Username"), data.get("Secret")
    if not user or not secret or user == "<token>":  # <token>: an identity token, see above
        return None
    return Credentials(user, secret)


def credentials(host: str) -> Credentials | None:
    """The stored login for registry `host` (host[:port]), or None."""
    cfg = _read_config()
    keys = _keys(host)
    helpers = cfg.get("credHelpers") if isinstance(cfg.get("credHelpers"), dict) else {}
    for key in keys:
        if isinstance(helpers.get(key), str) and helpers[key]:
            return _from_helper(helpers[key], HUB_KEY if key == HUB_KEY else host)
    auths = cfg.get("auths") if isinstance(cfg.get("auths"), dict) else {}
    for key in keys:
        found = _from_entry(auths.get(key))
        if found:
            return found
    if isinstance(cfg.get("credsStore"), str) and cfg["credsStore"]:
        return _from_helper(cfg["credsStore"], keys[0] if keys[0] == HUB_KEY else host)
    return None
