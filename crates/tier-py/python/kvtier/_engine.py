"""What every engine adapter shares: where the hierarchy's config comes from, and failure
logging that cannot flood an engine's log."""

from __future__ import annotations

import json
import logging
import threading
import time
import tomllib

from . import ConfigError

def load_config(extra: dict, where: str = "extra_config") -> dict:
    """The hierarchy config: from ``extra["config"]`` (a TOML or JSON path) or inline from
    ``extra["tiers"]`` and ``extra["hierarchy"]``; ``where`` names ``extra`` in errors."""
    path = extra.get("config")
    if path:
        try:
            text = open(path, encoding="utf-8").read()
        except OSError as e:
            raise ConfigError(f"cannot read kvtier config {path}: {e}") from None
        try:
            return json.loads(text) if str(path).endswith(".json") else tomllib.loads(text)
        except ValueError as e:
            raise ConfigError(f"kvtier config {path}: {e}") from None
    if extra.get("tiers"):
        return {"tiers": extra["tiers"], "hierarchy": extra.get("hierarchy", {})}
    raise ConfigError(f'kvtier needs {where}["config"] (a TOML or JSON path) or {where}["tiers"]')


class RateLimitedLog:
    """Logs the first few failures of each kind, then one in a while with a count."""

    def __init__(self, logger: logging.Logger, burst: int = 5, every_s: float = 10.0):
        self.logger, self.burst, self.every_s = logger, burst, every_s
        self.lock = threading.Lock()
        self.seen: dict = {}

    def warn(self, what: str, err: BaseException) -> None:
        now = time.monotonic()
        with self.lock:
            count, last = self.seen.get(what, (0, 0.0))
            count += 1
            loud = count <= self.burst or now - last >= self.every_s
            self.seen[what] = (count, now if loud else last)
        if loud:
            self.logger.warning("kvtier %s failed (%d so far): %s", what, count, err)
