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

    def __init__(self, tmp, tiers, mla=False):
        self.tiers, self.mla = tiers, mla
        self.sync = tmp / f"sync-{time.monotonic_ns()}"
        self.sync.mkdir()
        self.procs = {}

    def start(self, name, cfg, *steps, world=None):
        spec = {"name": name, "world": world, "sync": str(self.sync), "tiers": self.tiers, "mla": self.mla,
                "cfg": cfg}
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


@pytest.mark.parametrize("kind", ["nixl-file-path", "object"])
def test_mla_dp_attention_groups_each_write_once_and_every_rank_reads(kind, tmp, s3):
    """DeepSeek-style serving: MLA, 2 DP groups x 2 attention-TP ranks, four processes from
    one config at once. Each group's writer (tp_rank 0) stores its pages, every rank of the
    group reads them byte-exact (the other rank as a reader of the writer's folder); a clear
    from group 0 removes group 0's pages, group 1's stay."""
    ranks = Ranks(tmp, tier_configs(kind, tmp, s3), mla=True)

    def steps(name, cfg):
        seed = str(10 + cfg["dp_rank"])
        writer = cfg["tp_rank"] == 0
        out = ["absent", "barrier:open"]
        out += ["write:" + seed] if writer else ["write:99"]  # SGLang skips the reader's backup; so does kvtier
        out += ["barrier:written", "read:" + seed, "barrier:read"]
        if name == "dp0tp0":
            out += ["clear"]
        out += ["barrier:cleared"]
        out += ["absent"] if cfg["dp_rank"] == 0 else ["read:" + seed]
        return out

    ranks.start_all(dp_tp(), steps)
    opened = ranks.finish()
    print(f"{kind}: MLA 2 DP x 2 TP, 4 processes opened in {max(opened.values()):.1f} s at most; "
          "each group's readers read its writer's pages; group 0's clear left group 1's pages")


@pytest.mark.parametrize("kind", ["nixl-file-path", "object"])
def test_mha_dp_attention_ranks_each_keep_their_own(kind, tmp, s3):
    """MHA with DP attention, 2 x 2: every rank writes its own pages under the same keys
    (SGLang's hashes do not depend on the rank) and reads back only its own bytes."""
    ranks = Ranks(tmp, tier_configs(kind, tmp, s3))

    def steps(name, cfg):
        seed = str(20 + 2 * cfg["dp_rank"] + cfg["tp_rank"])
        return ["barrier:open", "write:" + seed, "barrier:written", "read:" + seed]

    ranks.start_all(dp_tp(), steps)
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
