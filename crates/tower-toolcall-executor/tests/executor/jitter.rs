//! The jitter of a step's retry pauses: within its band, drawn from the run's seed, recorded
//! in `run.json`, and waited again exactly by a replay.

use serde_json::json;
use tower_toolcall_executor::{reconstruct, replay, Executor, Plan, Turn, TurnStatus};

use crate::audit::temp_dir;
use crate::tools::{ok, registry, transient, Toolbox};

/// A step tried five times, 100 ms apart before jitter: four pauses.
fn retried_plan(retry: serde_json::Value) -> Plan {
    Plan::from_value(json!({"steps": [
        {"id": "weather", "tool": "travel::weather", "args": {}, "retry": retry}
    ]}))
    .unwrap()
}

/// Four transient failures, then an answer; every call takes no time, so the gaps between
/// calls are the pauses.
fn flaky() -> Toolbox {
    Toolbox::new().script(
        "travel::weather",
        vec![
            transient(0),
            transient(0),
            transient(0),
            transient(0),
            ok(0),
        ],
    )
}

/// The pauses between the calls of a run of `plan` with jitter seed `seed`, in ms.
async fn pauses(plan: &Plan, seed: u64) -> Vec<u64> {
    let tools = flaky();
    let executor = Executor::builder(registry())
        .jitter_seed(seed)
        .build()
        .unwrap();
    let run = executor
        .start(tools.service(), plan, Turn::new("sess-1", "user-1"))
        .unwrap();
    assert_eq!(run.jitter_seed(), seed);
    let result = run.finish().await;
    assert_eq!(result.status, TurnStatus::Completed, "{}", result.message);
    let times = tools.times("travel::weather");
    assert_eq!(times.len(), 5);
    times
        .windows(2)
        .map(|w| u64::try_from((w[1] - w[0]).as_millis()).unwrap())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn pauses_fall_in_the_ten_percent_band_and_follow_the_seed() {
    let plan = retried_plan(json!({"maxAttempts": 5, "backoffMs": 100}));
    let mut by_seed = Vec::new();
    for seed in 0..16 {
        let waited = pauses(&plan, seed).await;
        for pause in &waited {
            assert!((90..=110).contains(pause), "seed {seed}: {waited:?}");
        }
        // The same seed gives the same pauses.
        assert_eq!(pauses(&plan, seed).await, waited, "seed {seed}");
        by_seed.push(waited);
    }
    // The pauses vary within a run and between seeds: there is jitter.
    by_seed.sort();
    by_seed.dedup();
    assert_eq!(by_seed.len(), 16, "{by_seed:?}");
    assert!(by_seed.iter().any(|p| p.iter().any(|&ms| ms != p[0])));
}

#[tokio::test(start_paused = true)]
async fn jitter_percent_sets_the_band_and_zero_waits_exactly() {
    for (retry, band) in [
        (
            json!({"maxAttempts": 5, "backoffMs": 100, "jitterPercent": 0}),
            100..=100,
        ),
        (
            json!({"maxAttempts": 5, "backoffMs": 100, "jitter_percent": 50}),
            50..=150,
        ),
    ] {
        let plan = retried_plan(retry.clone());
        let mut seen = Vec::new();
        for seed in 0..8 {
            let waited = pauses(&plan, seed).await;
            assert!(
                waited.iter().all(|ms| band.contains(ms)),
                "{retry}: {waited:?}"
            );
            seen.extend(waited);
        }
        if band.end() - band.start() > 20 {
            // Wider than ±10 %: some pause falls outside 90..=110.
            assert!(seen.iter().any(|ms| !(90..=110).contains(ms)), "{seen:?}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_jitter_percent_above_100_is_refused_before_anything_runs() {
    let tools = flaky();
    let plan = retried_plan(json!({"maxAttempts": 5, "backoffMs": 100, "jitterPercent": 150}));
    let error = Executor::builder(registry())
        .build()
        .unwrap()
        .start(tools.service(), &plan, Turn::new("sess-1", "user-1"))
        .unwrap_err();
    let problem = &error.problems()[0];
    assert_eq!(problem.field, "steps[0].retry.jitterPercent");
    assert!(
        problem.problem.contains("at most 100"),
        "{}",
        problem.problem
    );
    assert_eq!(tools.total(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_recorded_run_with_retries_replays_its_pauses_exactly() {
    let root = temp_dir("jitter-replay");
    // No seed set: the run draws its own, and records it.
    let executor = Executor::builder(registry())
        .audit_dir(&root)
        .build()
        .unwrap();
    let tools = flaky();
    let plan = retried_plan(json!({"maxAttempts": 5, "backoffMs": 1000, "jitterPercent": 40}));
    let run = executor
        .start(
            tools.service(),
            &plan,
            Turn::new("sess-1", "user-1").with_run_id("run-j"),
        )
        .unwrap();
    let seed = run.jitter_seed();
    let result = run.finish().await;
    assert_eq!(result.status, TurnStatus::Completed, "{}", result.message);

    // Written as a decimal string, which JSON readers holding numbers as doubles keep whole.
    let run_file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("run-j").join("run.json")).unwrap())
            .unwrap();
    assert_eq!(run_file["jitterSeed"], json!(seed.to_string()));
    let recorded = reconstruct(root.join("run-j")).unwrap();
    assert_eq!(recorded.jitter_seed, Some(seed));
    assert_eq!(recorded.calls.len(), 5);

    // The replay's executor has another seed of its own: the recorded one wins.
    let other = Executor::builder(registry())
        .jitter_seed(seed.wrapping_add(1))
        .build()
        .unwrap();
    let report = replay(&recorded, &other).await.unwrap();
    assert_eq!(report.divergence, None);
    assert_eq!(report.result.status, TurnStatus::Completed);
    let at = |events: &[tower_toolcall::trace::ExecutionEvent]| -> Vec<(String, Option<u64>)> {
        events
            .iter()
            .filter(|e| e.kind == "step.started")
            .map(|e| (e.call_id.clone().unwrap(), e.elapsed_ms))
            .collect()
    };
    let recorded_starts = at(&recorded.events);
    assert_eq!(recorded_starts.len(), 5);
    assert_eq!(at(&report.events), recorded_starts);

    // Without the recorded seed the same run waits other pauses.
    let mut unseeded = recorded.clone();
    unseeded.jitter_seed = None;
    let report = replay(&unseeded, &other).await.unwrap();
    assert_ne!(at(&report.events), recorded_starts);
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_run_without_a_set_seed_draws_a_fresh_one() {
    let executor = Executor::builder(registry()).build().unwrap();
    let plan = retried_plan(json!({"maxAttempts": 2, "backoffMs": 100}));
    let seeds: Vec<u64> = (0..4)
        .map(|_| {
            executor
                .start(flaky().service(), &plan, Turn::new("sess-1", "user-1"))
                .unwrap()
                .jitter_seed()
        })
        .collect();
    let mut distinct = seeds.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 4, "{seeds:?}");
}
