"""SGLang ranks in separate processes on one config (one folder, one bucket), started at the
same moment, as SGLang's one-process-per-rank launch runs them: TP, PP and DP attention, MHA and
MLA. SGLang gives each rank the same extra config; kvtier derives each rank's namespace and
whether it writes (SGLang's ``is_storage_writer``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import tier_configs

HERE = Path(__file__).resolve().parent
OPEN_WITHIN_S = 10.0


class Ranks:
    """The processes of one deployment, sharing a sync folder for barriers."""

    def __init__(self, tmp, tiers, mla=False, mamba=False):
        self.tiers, self.mla, self.mamba = tiers, mla, mamba
        self.sync = tmp / f"sync-{time.monotonic_ns()}"
        self.sync.mkdir()
        self.procs = {}

    def start(self, name, cfg, *steps, world=None, tiers=None):
        """Starts rank `name` (`tiers`: its own config, where it differs from the others')."""
        spec = {"name": name, "world": world, "sync": str(self.sync), "tiers": tiers or self.tiers,
                "mla": self.mla, "mamba": self.mamba, "cfg": cfg}
        self.procs[name] = subprocess.Popen(
            [sys.executable, str(HERE / "rank_worker.py"), json.dumps(spec), *steps],
            cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        return self.procs[name]

    def start_all(self, layout, steps):
        """Starts one process per rank of `layout` (name -> storage config fields) at once;
        `steps(name, cfg)` gives each its steps."""
        for name, cfg in layout.items():
            self.start(name, cfg, *steps(name, cfg), world=len(layout))

    def finish(self):
        """Waits for every process; the first failure explains the others' barrier timeouts."""
        outs = {n: p.communicate(timeout=300)[0] for n, p in self.procs.items()}
        failed = [(n, p.returncode, outs[n]) for n, p in self.procs.items() if p.returncode != 0]
        assert not failed, "\n".join(f"{n} failed ({code}):\n{out[-3000:]}" for n, code, out in failed)
        opened = {n: float((self.sync / f"{n}.opened").read_text()) for n in self.procs}
        slow = {n: t for n, t in opened.items() if t > OPEN_WITHIN_S}
        assert not slow, f"ranks took over {OPEN_WITHIN_S} s to open their backend: {slow}"
        self.procs = {}
        return opened


def dp_tp(dp=2, tp=2):
    """DP attention: `tp_rank` is the rank in its DP group (attention TP), `dp_rank` the group."""
    return {f"dp{d}tp{t}": {"dp_rank": d, "tp_rank": t, "tp_size": tp} for d in range(dp) for t in range(tp)}


SHARED_KINDS = ["nixl-file-path", "object", "gluster"]


def shared_tiers(kind, tmp, s3, gluster):
    """The config of every process (``gluster``: a NIXL FILE folder on the GlusterFS volume,
    through mount a) and, for ``gluster``, the same through mount b (another node)."""
    if kind != "gluster":
        tiers = tier_configs(kind, tmp, s3)
        return tiers, tiers
    a, b = gluster.folder("ranks")
    return ([{"kind": "nixl-file", "dirs": [str(a)], "path_mode": "on"}],
            [{"kind": "nixl-file", "dirs": [str(b)], "path_mode": "on"}])


def stored_pages(kind, tmp, s3, tiers):
    """The page files or objects stored (hidden files and kvtier's own objects aside)."""
    if kind == "object":
        root = s3.data / tiers[0]["bucket"]
    elif kind == "gluster":
        root = Path(tiers[0]["dirs"][0])
    else:
        root = tmp / "disk"
    return sorted(f for _, _, fs in os.walk(root) for f in fs if not f.startswith(".") and "kvtier" not in f)


@pytest.mark.parametrize("kind", SHARED_KINDS)
def test_mla_dp_attention_groups_share_one_copy(kind, tmp, s3, gluster):
    """DeepSeek-style serving: MLA, 2 DP groups x 2 attention-TP ranks, four processes from
    one config at once (on GlusterFS each group through a mount of its own: two nodes). MLA
    pages are the same on every rank of every group: each group's writer (tp_rank 0) stores
    its prefixes, every rank of both groups reads both groups' pages byte-exact, and storage
    holds one copy of each page. A clear removes the model's pages for every group."""
    on_a, on_b = shared_tiers(kind, tmp, s3, gluster)
    ranks = Ranks(tmp, on_a, mla=True)

    def steps(name, cfg):
        writer = cfg["tp_rank"] == 0
        mine = f"{10 + cfg['dp_rank']}@d{cfg['dp_rank']}"
        out = ["absent:@d0", "absent:@d1", "barrier:open"]
        # SGLang skips a non-writer's backup; so does kvtier (its write is reported stored).
        out += ["write:" + mine] if writer else ["write:99@d9", "absent:@d9"]
        out += ["barrier:written", "read:10@d0", "read:11@d1", "barrier:read"]
        if name == "dp0tp0":
            out += ["clear"]
        out += ["barrier:cleared", "gone:@d0", "gone:@d1"]
        return out

    for name, cfg in dp_tp().items():
        ranks.start(name, cfg, *steps(name, cfg), world=4,
                    tiers=on_a if cfg["dp_rank"] == 0 else on_b)
    opened = ranks.finish()
    print(f"{kind}: MLA 2 DP x 2 TP, 4 processes opened in {max(opened.values()):.1f} s at most; "
          "every rank read both groups' pages; one copy of each")


@pytest.mark.parametrize("kind", SHARED_KINDS)
def test_mla_dp_attention_stores_one_copy_of_each_page(kind, tmp, s3, gluster):
    """Both DP groups' writers store the same prefix (the same keys, the same bytes, as two
    groups serving one prompt do) at the same moment: storage holds one copy of each page,
    which every rank reads byte-exact."""
    on_a, on_b = shared_tiers(kind, tmp, s3, gluster)
    ranks = Ranks(tmp, on_a, mla=True)
    for name, cfg in dp_tp().items():
        steps = ["barrier:open"] + (["write:12@cc"] if cfg["tp_rank"] == 0 else [])
        steps += ["barrier:written", "read:12@cc"]
        ranks.start(name, cfg, *steps, world=4, tiers=on_a if cfg["dp_rank"] == 0 else on_b)
    ranks.finish()
    pages = stored_pages(kind, tmp, s3, on_a)
    assert len(pages) == 8, f"8 pages stored by two groups take {len(pages)} files or objects: {pages}"


@pytest.mark.parametrize("kind", SHARED_KINDS)
def test_mha_dp_attention_groups_share_each_tp_ranks_pages(kind, tmp, s3, gluster):
    """MHA with DP attention, 2 x 2: a TP rank holds the same heads in every group. Group 0's
    ranks store; group 1's ranks, which store nothing, read their own TP rank's pages
    byte-exact (never the other rank's heads): one copy per TP rank for both groups."""
    on_a, on_b = shared_tiers(kind, tmp, s3, gluster)
    ranks = Ranks(tmp, on_a)
    for name, cfg in dp_tp().items():
        mine = str(20 + cfg["tp_rank"])
        steps = ["barrier:open"] + (["write:" + mine] if cfg["dp_rank"] == 0 else [])
        steps += ["barrier:written", "read:" + mine]
        ranks.start(name, cfg, *steps, world=4, tiers=on_a if cfg["dp_rank"] == 0 else on_b)
    ranks.finish()
    pages = stored_pages(kind, tmp, s3, on_a)
    assert len(pages) == 16, f"2 TP ranks x 8 pages take {len(pages)} files or objects"


@pytest.mark.parametrize("kind", ["nixl-file-path", "gluster"])
def test_two_servers_on_one_config_start_at_once_and_share(kind, tmp, s3, gluster):
    """Two SGLang servers (replicas, TP 2 each, no DP attention: every rank's ``dp_rank`` is
    0) on one config, four processes started at the same moment: every rank opens at once
    (an owned folder made the second server wait 5 s and fail), and each server hits the
    pages the other stored, byte-exact."""
    on_a, on_b = shared_tiers(kind, tmp, s3, gluster)
    ranks = Ranks(tmp, on_a)
    for server in ("a", "b"):
        other = "b" if server == "a" else "a"
        for tp in range(2):
            seed = lambda s: str(40 + 2 * (s == "b") + tp)  # noqa: E731
            ranks.start(f"{server}tp{tp}", {"tp_rank": tp, "tp_size": 2},
                        "barrier:open", f"write:{seed(server)}@{server}a", "barrier:written",
                        f"read:{seed(other)}@{other}a", f"read:{seed(server)}@{server}a",
                        world=4, tiers=on_a if server == "a" else on_b)
    ranks.finish()


@pytest.mark.parametrize("kind", ["nixl-file-path", "object"])
def test_pipeline_stages_each_keep_their_own(kind, tmp, s3):
    """PP 2 x TP 2, MHA: four processes, each stage's ranks their own pages; a clear from one
    stage's rank leaves the other stage's pages."""
    ranks = Ranks(tmp, tier_configs(kind, tmp, s3))
    layout = {f"pp{p}tp{t}": {"pp_rank": p, "pp_size": 2, "tp_rank": t, "tp_size": 2}
              for p in range(2) for t in range(2)}

    def steps(name, cfg):
        seed = str(30 + 2 * cfg["pp_rank"] + cfg["tp_rank"])
        out = ["barrier:open", "write:" + seed, "barrier:written", "read:" + seed]
        if name == "pp1tp0":
            out += ["clear"]
        out += ["barrier:cleared"]
        out += ["absent"] if name == "pp1tp0" else ["read:" + seed]
        return out

    ranks.start_all(layout, steps)
    ranks.finish()


def test_mla_readers_see_the_writers_pages_through_its_dram_tier(tmp):
    """MLA over DRAM and NIXL FILE: the writer's DRAM tier copies pages to the files in the
    background; readers, opened before anything was written, read them once flushed."""
    tiers = [{"kind": "mem", "capacity": "64MiB"}] + tier_configs("nixl-file-path", tmp)
    ranks = Ranks(tmp, tiers, mla=True)
    layout = {f"tp{r}": {"tp_rank": r, "tp_size": 3} for r in range(3)}

    def steps(name, cfg):
        if cfg["tp_rank"] == 0:
            return ["barrier:open", "write:7", "flush", "barrier:written", "read:7"]
        return ["absent", "barrier:open", "barrier:written", "read:7"]

    ranks.start_all(layout, steps)
    ranks.finish()


@pytest.mark.parametrize("kind", ["nixl-file-path", "object"])
def test_tp_ranks_keep_private_pages_and_clear_only_their_own(kind, tmp, s3):
    ranks = Ranks(tmp, tier_configs(kind, tmp, s3))
    ranks.start("tp0", {"tp_rank": 0, "tp_size": 2}, "write:100", "barrier:written", "read:100",
                "barrier:cleared", "read:100", world=2)
    ranks.start("tp1", {"tp_rank": 1, "tp_size": 2}, "write:101", "barrier:written", "read:101", "clear",
                "absent", "barrier:cleared", world=2)
    ranks.finish()


def test_a_rank_killed_mid_write_harms_no_other_and_leaves_whole_pages(tmp):
    """Rank 1 rewrites its pages in a loop (two contents in turn) and is killed with SIGKILL
    in the middle of one: rank 0 is unharmed, and the restarted rank 1 finds every page whole
    (one of the two contents, never a torn mix) and no temp file."""
    tiers = tier_configs("nixl-file-path", tmp)
    ranks = Ranks(tmp, tiers)
    r0 = ranks.start("tp0", {"tp_rank": 0, "tp_size": 2}, "write:200", "barrier:a", "barrier:b", "read:200",
                     world=2)
    r1 = ranks.start("tp1", {"tp_rank": 1, "tp_size": 2}, "write:201", "barrier:a", "write_forever:202",
                     world=2)
    writes = ranks.sync / "tp1.writes"
    deadline = time.monotonic() + 120
    while not writes.exists() or int(writes.read_text() or 0) < 5:
        assert time.monotonic() < deadline and r1.poll() is None, "rank 1 never got going"
        time.sleep(0.005)
    r1.send_signal(signal.SIGKILL)
    r1.wait(timeout=30)
    del ranks.procs["tp1"]
    (ranks.sync / "b.tp1").touch()  # stands in for the dead rank at the barrier
    out = r0.communicate(timeout=300)[0]
    assert r0.returncode == 0, out
    del ranks.procs["tp0"]
    leftovers_before = [f for _, _, fs in os.walk(tmp / "disk") for f in fs if f.startswith(".tmp-")]
    ranks.start("tp1", {"tp_rank": 1, "tp_size": 2}, "present", "read_any:202,203", world=1)
    ranks.finish()
    leftovers = [f for _, _, fs in os.walk(tmp / "disk") for f in fs if f.startswith(".tmp-")]
    assert not leftovers, leftovers
    print(f"killed after {writes.read_text()} writes; temp files before restart: {len(leftovers_before)}")


@pytest.mark.parametrize("kind", ["nixl-file-path", "gluster"])
def test_side_pools_are_namespaced_by_pool_and_mamba_by_tp_rank_under_mla(kind, tmp, s3, gluster):
    """MLA KV pages are one copy for the attention group, but each TP rank holds its own shard
    of the Mamba state. Two ranks, two processes at once (on GlusterFS through a mount each):
    rank 1 finds rank 0's KV pages, misses rank 0's Mamba shard and stores its own, and each
    reads back its own shard byte-exact. (It ran as two backends in one process.)"""
    on_a, on_b = shared_tiers(kind, tmp, s3, gluster)
    ranks = Ranks(tmp, on_a, mla=True, mamba=True)
    ranks.start("tp0", {"tp_rank": 0, "tp_size": 2}, "write:9@e7", "state_write:10@e7", "flush",
                "barrier:written", "barrier:theirs", "state_read:10@e7", world=2)
    ranks.start("tp1", {"tp_rank": 1, "tp_size": 2}, "barrier:written", "present:@e7",
                "state_gone:@e7", "state_write:11@e7", "flush", "barrier:theirs",
                "state_read:11@e7", world=2, tiers=on_b)
    ranks.finish()


@pytest.mark.parametrize("kind", ["nixl-file-path", "gluster"])
def test_mla_reader_ranks_keep_their_mamba_shards_where_the_writer_owns_the_folders(kind, tmp, s3, gluster):
    """A hybrid MLA model (Mamba states per TP rank) with ``access = "owner"``: the attention
    group's writer (rank 0) owns the folders and rank 1 reads them, but SGLang backs up each
    rank's own Mamba shard on every rank. Two processes at once (on GlusterFS through a mount
    each: two nodes): each stores its shard, reads it back byte-exact with the writer's KV
    prefix a hit; rank 1's clear takes its shard only. (Rank 1 writing into the writer's
    folders failed every state.)"""
    on_a, on_b = shared_tiers(kind, tmp, s3, gluster)
    owned_a, owned_b = ([{**t, "access": "owner"} for t in tiers] for tiers in (on_a, on_b))
    ranks = Ranks(tmp, owned_a, mla=True, mamba=True)
    ranks.start("tp0", {"tp_rank": 0, "tp_size": 2}, "write:9@e6", "state_write:10@e6", "flush",
                "barrier:written", "state_read:10@e6", "barrier:read", "barrier:cleared",
                "state_read:10@e6", world=2)
    ranks.start("tp1", {"tp_rank": 1, "tp_size": 2}, "state_write:11@e6", "barrier:written",
                "state_read:11@e6", "read:9@e6", "barrier:read", "clear", "state_gone:@e6",
                "present:@e6", "barrier:cleared", world=2, tiers=owned_b)
    ranks.finish()
