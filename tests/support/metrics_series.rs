//! What metrics-util's debugging recorder holds, named `name{label=value,…}` with the labels
//! sorted, so that tests compare series by one string.

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;

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
