"""What every engine adapter shares: where the hierarchy's config comes from, a folder of its
own for each engine instance on one config, and failure logging that cannot flood an engine's
log."""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from . import ConfigError, Store, Unavailable
from ._kvtier import config_json

logger = logging.getLogger(__name__)

# Engine instances one config serves on one machine before opening fails.
MAX_INSTANCES = 64


def load_config(extra: dict[str, Any], where: str = "extra_config") -> dict[str, Any]:
    """The hierarchy config: from ``extra["config"]`` (a TOML or JSON path) or inline from
    ``extra["tiers"]`` and ``extra["hierarchy"]``; ``where`` names ``extra`` in errors."""
    path = extra.get("config")
    if path:
        try:
            text = open(path, encoding="utf-8").read()
        except OSError as e:
            raise ConfigError(f"cannot read kvtier config {path}: {e}") from None
        # Parsed by the parser the store uses (TOML or JSON), handed over as JSON.
        config: dict[str, Any] = json.loads(config_json(text, str(path)))
        return config
    if extra.get("tiers"):
        tiers, hierarchy = extra["tiers"], extra.get("hierarchy") or {}
        if not isinstance(tiers, list) or not all(isinstance(t, dict) for t in tiers):
            raise ConfigError(f'{where}["tiers"] must be a list of tables, not {tiers!r}')
        if not isinstance(hierarchy, dict):
            raise ConfigError(f'{where}["hierarchy"] must be a table, not {hierarchy!r}')
        return {"tiers": tiers, "hierarchy": hierarchy}
    raise ConfigError(f'kvtier needs {where}["config"] (a TOML or JSON path) or {where}["tiers"]')


def bound_ms(name: str, value: Any) -> float | None:
    """A per-call bound given in milliseconds, as seconds (``None``: the hierarchy's own
    bounds); anything but a positive whole number of milliseconds is a :class:`ConfigError`
    naming ``name``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive whole number of milliseconds, not {value!r}")
    return value / 1000.0


def namespace(
    engine: str, parts: list[str], tenant: str | None = None, secret: bytes | None = None
) -> str:
    """The namespace of an engine's pages: its short name and a digest of everything that makes
    two pages under one key hold different bytes (model, revision, dtype, ranks, geometry,
    layout), and of the tenant, so tenants sharing a folder or bucket never meet. With the
    integrity ``secret`` of the config's tiers (see :func:`integrity_secret`) the digest is keyed
    by it: without the secret no one can name a tenant's pages, to probe them with ``exists``
    or to plant them."""
    if tenant:
        parts = [*parts, f"tenant={tenant}"]
    key = hashlib.blake2b(secret, digest_size=32, person=b"kvtier-ns").digest() if secret else b""
    return engine + hashlib.blake2b("|".join(parts).encode(), digest_size=8, key=key).hexdigest()


class PageNames:
    """How an engine's page keys become kvtier keys under a namespace: ``<namespace>-<key>``;
    with the integrity ``secret``, ``<namespace>-k<keyed digest of the key>``, so a co-tenant
    who lists the folder or bucket never reads the engine's chain hashes (which would tell
    whether a known document was prompted)."""

    def __init__(self, secret: bytes | None):
        self._key = (
            hashlib.blake2b(secret, digest_size=32, person=b"kvtier-name").digest()
            if secret
            else None
        )

    def __call__(self, namespace: str, key: str) -> str:
        if self._key is None:
            return f"{namespace}-{key}"
        data = key.encode("utf-8", "surrogatepass")
        digest = hashlib.blake2b(data, digest_size=20, key=self._key)
        return f"{namespace}-k{digest.hexdigest()}"


def integrity_secret(config: dict[str, Any]) -> bytes | None:
    """The secret of the first tier of ``config`` with ``integrity`` (its ``key_env`` or
    ``key_file``, as the store reads it), or ``None``; a secret that cannot be read is the
    store's ``ConfigError`` when it opens."""
    for tier in config.get("tiers", []):
        integrity = tier.get("integrity") if isinstance(tier, dict) else None
        if not isinstance(integrity, dict):
            continue
        if integrity.get("key_env"):
            value = os.environ.get(str(integrity["key_env"]))
            return value.encode().strip() if value else None
        if integrity.get("key_file"):
            return _read_key_file(str(integrity["key_file"]))
    return None


# The largest key file read, as the store reads it.
_MAX_KEY_FILE = 4096


def _read_key_file(path: str) -> bytes | None:
    """The secret in ``path``, read as the store reads it: from the descriptor that was checked,
    never through a link or from a FIFO, only from a regular file of this user (or root)
    readable by its owner alone, at most 4 KiB; ``None`` otherwise."""
    import stat

    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o077:
            return None
        secret = f.read(_MAX_KEY_FILE + 1)
    return secret.strip() if len(secret) <= _MAX_KEY_FILE else None


def serve_metrics(store: Any, host: str, port: int, fallback: bool = False) -> tuple[Any, ...]:
    """Serves ``store``'s Prometheus metrics at ``host:port`` and returns the address served. A
    port another process holds is a :class:`ConfigError` naming it (a scraper configured for it
    would read the other process's numbers), unless ``fallback``: then it is logged and any
    free port served instead."""
    try:
        bound: tuple[Any, ...] = store.serve_metrics(f"{host}:{port}")
        return bound
    except Exception as e:
        if not fallback:
            raise ConfigError(
                f"metrics_addr {host}:{port} cannot be served ({e}); choose a free port, or set "
                "metrics_port_fallback to serve on any free port instead"
            ) from e
        bound = store.serve_metrics(f"{host}:0")
        logger.warning(
            "kvtier: metrics port %d unavailable (%s); serving on %s:%d", port, e, *bound
        )
        return bound


class RateLimitedLog:
    """Logs the first few failures of each kind, then one in a while with a count."""

    def __init__(self, logger: logging.Logger, burst: int = 5, every_s: float = 10.0):
        self.logger, self.burst, self.every_s = logger, burst, every_s
        self.lock = threading.Lock()
        self.seen: dict[str, Any] = {}

    def warn(self, what: str, err: BaseException) -> None:
        now = time.monotonic()
        with self.lock:
            count, last = self.seen.get(what, (0, 0.0))
            count += 1
            loud = count <= self.burst or now - last >= self.every_s
            self.seen[what] = (count, now if loud else last)
        if loud:
            self.logger.warning("kvtier %s failed (%d so far): %s", what, count, err)


def close_all(log: RateLimitedLog, what: str, *closers: Callable[[], object]) -> None:
    """Calls each closer in turn, every one even if an earlier one fails; failures are logged
    as ``what`` (an engine's shutdown never raises)."""
    for close in closers:
        try:
            close()
        except Exception as e:
            log.warn(what, e)


def shared_by_default(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` as engine instances open it: one cache for every instance, replica and node
    on it (1x the capacity, not 1/N). A NIXL FILE tier that names no ``access`` opens its
    folders with ``access = "shared"``, and a bounded object or NIXL OBJ tier that names none
    bounds its prefix as ``"shared"``. A tier that names its ``access`` keeps it; one that names
    a ``policy`` (which shared access refuses: it evicts by last use across processes) keeps the
    owner or private default, with a warning."""
    tiers = []
    for tier in config.get("tiers", []):
        if not isinstance(tier, dict) or "access" in tier:
            tiers.append(tier)
            continue
        kind = tier.get("kind")
        sharable = kind == "nixl-file" or (
            kind in ("object", "nixl-obj") and tier.get("capacity") is not None
        )
        if sharable and tier.get("policy") is not None:
            logger.warning(
                "kvtier: the %s tier names a policy, so it is not shared across engine "
                'instances; set access = "shared" (without policy) to share it, or '
                'access = "owner"/"private" to silence this',
                kind,
            )
        elif sharable:
            tier = {**tier, "access": "shared"}
        tiers.append(tier)
    return {**config, "tiers": tiers}


def owned_file_tiers(config: dict[str, Any]) -> list[Any]:
    """The NIXL FILE tiers of ``config`` that own their folders (one process each)."""
    return [
        t
        for t in config.get("tiers", [])
        if t.get("kind") == "nixl-file"
        and t.get("access", "owner") == "owner"
        and isinstance(t.get("dirs"), list)
        and t["dirs"]
    ]


class InstanceClaim:
    """Instance ``index`` of the engines sharing one config: a lock held on
    ``<first folder>/.instance-<index>.lock`` while the instance's store is open."""

    def __init__(self, index: int, fd: int | None):
        self.index, self._fd = index, fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _claim(folder: str, index: int, group: bool = False) -> int | None:
    """The lock of instance `index` in `folder`, or None when another instance holds it. The
    folder is made as the store makes its folders (``0700``, ``2770`` for a group's), the lock
    file never opened through a link, and made ``0600`` (``0660``) whatever the umask."""
    path = os.path.join(folder, f".instance-{index}.lock")
    dir_mode, file_mode = (0o2770, 0o660) if group else (0o700, 0o600)
    try:
        if not os.path.isdir(folder):
            os.makedirs(folder, mode=dir_mode, exist_ok=True)
            os.chmod(folder, dir_mode)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, file_mode)
    except OSError as e:
        raise ConfigError(f"cannot create the engine instance lock {path}: {e}") from None
    try:
        os.fchmod(fd, file_mode)
    except OSError:
        pass  # another user's lock file, in a group's folder: its mode is theirs
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def open_instance(
    config: dict[str, Any], opener: Callable[[dict[str, Any]], Any] = Store
) -> tuple[Any, InstanceClaim]:
    """Opens the store of one engine instance. Engines started from one config (two vLLM
    servers, two LMCache servers on a node) would contend for the folders of its NIXL FILE
    tiers, which one process owns at a time: each instance takes the lowest free index ``k``
    and its own folders ``<dir>/instance-<k>`` under each configured folder (the first
    instance of a restarted set finds its pages again). Configs without owned folders open
    as they are: folders in ``access = "shared"`` (the default, see
    :func:`shared_by_default`) are one cache for every instance."""
    config = shared_by_default(config)
    tiers = owned_file_tiers(config)
    if not tiers:
        return opener(config), InstanceClaim(0, None)
    base = str(tiers[0]["dirs"][0])
    group = tiers[0].get("mode") == "group"
    for index in range(MAX_INSTANCES):
        fd = _claim(base, index, group)
        if fd is None:
            continue
        claim = InstanceClaim(index, fd)
        instance = {
            **config,
            "tiers": [
                {**t, "dirs": [os.path.join(str(d), f"instance-{index}") for d in t["dirs"]]}
                if any(t is o for o in tiers)
                else t
                for t in config.get("tiers", [])
            ],
        }
        try:
            store = opener(instance)
        except Unavailable as e:
            # Claimed, yet its folders are in use: another tool (not an engine instance)
            # holds them. The next index.
            claim.release()
            logger.warning(
                "kvtier: instance %d's folders are in use (%s); trying the next", index, e
            )
            continue
        except BaseException:
            claim.release()
            raise
        if index:
            logger.info(
                "kvtier: engine instance %d on this config: folders %s",
                index,
                [os.path.join(str(d), f"instance-{index}") for t in tiers for d in t["dirs"]],
            )
        return store, claim
    raise Unavailable(f"{MAX_INSTANCES} engine instances already use the folders under {base}")
