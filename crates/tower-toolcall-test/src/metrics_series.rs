//! What metrics-util's debugging recorder holds, named `name{label=value,…}` with the labels
//! sorted, so that tests compare series by one string.

use std::future::Future;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;

/// Runs `test` on a current-thread runtime with paused time, its metrics recorded by
/// `recorder`.
pub fn run_recorded<F: Future>(recorder: &DebuggingRecorder, test: F) -> F::Output {
    metrics::with_local_recorder(recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(test)
    })
}

/// Every series the recorder holds: its kind, its `name{label=value,…}` and its value.
pub fn series(recorder: &DebuggingRecorder) -> Vec<(MetricKind, String, DebugValue)> {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let (kind, key) = key.into_parts();
            let mut labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            (
                kind,
                format!("{}{{{}}}", key.name(), labels.join(",")),
                value,
            )
        })
        .collect()
}
