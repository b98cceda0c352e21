"""Engine instances on one config whose NIXL FILE tier is ``access = "shared"``: each runs in
a process of its own, at the same moment, opens the same folders (no per-instance folder, as
owned folders get), and loads the pages the others stored, under one capacity for all."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

PAGE = 64 << 10
INSTANCES = 3
PAGES = 48

WORKER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from kvtier._engine import open_instance

    config, me, sync = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    PAGE, PAGES, N = %d, %d, %d

    def page(owner, i):
        return bytes([(owner * 31 + i) %% 251]) * PAGE

    store, claim = open_instance(config)
    keys = [f"{me:02x}{i:062x}" for i in range(PAGES)]
    assert all(e is None for e in store.put(keys, [page(me, i) for i in range(PAGES)]))
    open(f"{sync}/{me}.written", "w").close()
    deadline = time.monotonic() + 60
    while sum(Path(sync, f"{o}.written").exists() for o in range(N)) < N:
        assert time.monotonic() < deadline, "the other instances never wrote"
        time.sleep(0.02)
    found = checked = 0
    for other in range(N):
        if other == me:
            continue
        theirs = [f"{other:02x}{i:062x}" for i in range(PAGES)]
        bufs = [bytearray(PAGE) for _ in theirs]
        for i, (r, buf) in enumerate(zip(store.get_into(theirs, bufs), bufs)):
            if r is True:
                assert bytes(buf) == page(other, i), f"page {i} of instance {other} is not its bytes"
                found += 1
            checked += 1
    levels = store.stats()["levels"]
    print(json.dumps({"index": claim.index, "found": found, "checked": checked,
                      "resident": levels[0]["resident_bytes"]}))
    store.close()
    """
)


def test_engine_instances_on_a_shared_folder_load_each_others_pages(tmp_path: Path) -> None:
    capacity = INSTANCES * PAGES * PAGE * 2 // 3
    config = {"tiers": [{"kind": "nixl-file", "dirs": [str(tmp_path / "kv")], "access": "shared",
                         "capacity": capacity}]}
    sync = tmp_path / "sync"
    sync.mkdir()
    script = WORKER % (PAGE, PAGES, INSTANCES)
    procs = [
        subprocess.Popen([sys.executable, "-c", script, json.dumps(config), str(i), str(sync)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(INSTANCES)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    results = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    assert [r["index"] for r in results] == [0] * INSTANCES, "shared folders are not split per instance"
    for r in results:
        assert r["found"] > 0, f"an instance found none of the others' pages: {results}"
        assert r["resident"] <= capacity * 1.1 + PAGE * PAGES, results
    # Under a capacity of two thirds of what they wrote, some pages were evicted.
    assert sum(r["found"] for r in results) < sum(r["checked"] for r in results), results
