//! Every schedule of small scenarios on kvtier's hierarchy (see `tier_tests::explore`): the
//! queue and in-flight set under write-back and write-through, with dropped calls.

use tier_hierarchy::WritePolicy;
use tier_tests::explore::{explore, Flaw, Scenario, Step};

fn run(scenario: Scenario) {
    let started = std::time::Instant::now();
    match explore(&scenario) {
        Ok(explored) => {
            assert!(
                !scenario.drops || explored.with_drop > 0,
                "scenario `{}` may drop calls but no schedule dropped one",
                scenario.name
            );
            println!(
            "scenario `{}`: {} schedules ({} with a dropped call, up to {} choices each), all checked, in {:?}",
            scenario.name,
            explored.schedules,
            explored.with_drop,
            explored.deepest,
            started.elapsed()
            )
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn write_back_demotions_land_in_order() {
    use Step::*;
    run(Scenario {
        name: "write_back_demotions_land_in_order",
        write: WritePolicy::WriteBack,
        top_pages: 1,
        clients: vec![
            vec![Put(0), Put(1), Put(0), Put(1)],
            vec![Get(0), Get(0), Get(0)],
        ],
        keys: 2,
        drops: false,
        tiny_queue: false,
        max_schedules: 200_000,
        admit_after: 1,
        flaw: None,
    });
}

#[test]
fn write_back_pages_are_readable_in_motion() {
    use Step::*;
    run(Scenario {
        name: "write_back_pages_are_readable_in_motion",
        write: WritePolicy::WriteBack,
        top_pages: 1,
        clients: vec![vec![Put(0), Put(1)], vec![Get(0), Get(0), Exists(0)]],
        keys: 2,
        drops: false,
        tiny_queue: false,
        max_schedules: 200_000,
        admit_after: 1,
        flaw: None,
    });
}

#[test]
fn write_back_remove_races_a_demotion() {
    use Step::*;
    run(Scenario {
        name: "write_back_remove_races_a_demotion",
        write: WritePolicy::WriteBack,
        top_pages: 1,
        clients: vec![
            vec![Put(0), Put(1), Get(0)],
            vec![Get(1), Remove(0), Get(0)],
        ],
        keys: 2,
        drops: true,
        tiny_queue: false,
        max_schedules: 200_000,
        admit_after: 1,
        flaw: None,
    });
}

#[test]
fn write_back_promotion_never_overwrites_a_put() {
    use Step::*;
    run(Scenario {
        name: "write_back_promotion_never_overwrites_a_put",
        write: WritePolicy::WriteBack,
        top_pages: 1,
        clients: vec![vec![Put(0), Put(1), Get(0)], vec![Put(0), Get(0)]],
        keys: 2,
        drops: true,
        tiny_queue: false,
        max_schedules: 200_000,
        admit_after: 1,
        flaw: None,
    });
}

#[test]
fn write_through_remove_races_the_copy_down() {
    use Step::*;
    run(Scenario {
        name: "write_through_remove_races_the_copy_down",
        write: WritePolicy::WriteThrough,
        top_pages: 2,
        clients: vec![vec![Put(0), Get(0)], vec![Get(0), Remove(0), Get(0)]],
        keys: 1,
        drops: true,
        tiny_queue: false,
        max_schedules: 200_000,
        admit_after: 1,
        flaw: None,
    });
}

#[test]
fn write_through_overwrites_race_their_copies() {
    use Step::*;
    run(Scenario {
        name: "write_through_overwrites_race_their_copies",
        write: WritePolicy::WriteThrough,
        top_pages: 1,
        clients: vec![vec![Put(0), Put(1), Put(0)], vec![Get(0), Get(0)]],
        keys: 2,
        drops: true,
        tiny_queue: false,
        max_schedules: 200_000,
        admit_after: 1,
        flaw: None,
    });
}

#[test]
fn write_back_with_a_full_queue_serves_nothing_stale() {
    use Step::*;
    run(Scenario {
        name: "write_back_with_a_full_queue_serves_nothing_stale",
        write: WritePolicy::WriteBack,
        top_pages: 1,
        clients: vec![vec![Put(0), Put(1), Put(0), Put(1)], vec![Get(0), Get(0)]],
        keys: 2,
        drops: true,
        tiny_queue: true,
        max_schedules: 200_000,
        admit_after: 1,
        flaw: None,
    });
}

#[test]
fn write_through_remove_forgets_a_queued_copy() {
    use Step::*;
    run(Scenario {
        name: "write_through_remove_forgets_a_queued_copy",
        write: WritePolicy::WriteThrough,
        top_pages: 2,
        clients: vec![
            vec![Put(1), Put(0), Get(0)],
            vec![Get(0), Remove(0), Get(0)],
        ],
        keys: 2,
        drops: true,
        tiny_queue: false,
        max_schedules: 200_000,
        admit_after: 1,
        flaw: None,
    });
}

#[test]
fn write_through_puts_dropped_while_waiting_for_room_leave_nothing() {
    use Step::*;
    run(Scenario {
        name: "write_through_puts_dropped_while_waiting_for_room_leave_nothing",
        write: WritePolicy::WriteThrough,
        top_pages: 2,
        clients: vec![
            vec![Put(0), Put(1), Put(0)],
            vec![Get(1), Remove(0), Get(0)],
        ],
        keys: 2,
        drops: true,
        tiny_queue: true,
        max_schedules: 200_000,
        admit_after: 1,
        flaw: None,
    });
}

/// With `admit_after = 2` in write-through the read that admits a page copies it down; a put
/// of a newer version racing that read, and the page's eviction from the one-page top tier,
/// never leave the older version to be served from below.
#[test]
fn write_through_the_read_that_admits_a_page_races_a_put() {
    use Step::*;
    run(Scenario {
        name: "write_through_the_read_that_admits_a_page_races_a_put",
        write: WritePolicy::WriteThrough,
        top_pages: 1,
        clients: vec![vec![Put(0), Get(0), Put(1), Get(0)], vec![Put(0)]],
        keys: 2,
        drops: true,
        tiny_queue: false,
        max_schedules: 200_000,
        admit_after: 2,
        flaw: None,
    });
}

/// The explorer's self-test: a lower tier that keeps a key's first page through later puts
/// lets the hierarchy serve a stale page once the top tier evicts the new one, and the
/// explorer finds a schedule that shows it.
#[test]
fn the_explorer_rejects_a_lower_tier_that_keeps_old_versions() {
    use Step::*;
    let scenario = Scenario {
        name: "flawed_lower_keeps_old_versions",
        write: WritePolicy::WriteThrough,
        top_pages: 1,
        clients: vec![vec![Put(0), Put(0), Put(1), Get(0)]],
        keys: 2,
        drops: false,
        tiny_queue: false,
        max_schedules: 200_000,
        admit_after: 1,
        flaw: Some(Flaw::LowerKeepsOldVersions),
    };
    match explore(&scenario) {
        Err(e) => println!("rejected, as it must be: {e}"),
        Ok(explored) => panic!(
            "{} schedules of a hierarchy over a lower tier that keeps old pages all passed",
            explored.schedules
        ),
    }
}
