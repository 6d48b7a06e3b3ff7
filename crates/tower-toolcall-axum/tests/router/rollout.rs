//! The gradual rollout, changed through the admin switches over HTTP.

use super::*;

async fn loop_of_four(gateway: &Gateway, session: &str) -> Vec<Answer> {
    let mut answers = Vec::new();
    for _ in 0..4 {
        answers.push(gateway.call(&search(session, "again"), &[]).await);
    }
    answers
}

#[tokio::test]
async fn the_rollout_percentage_changes_through_the_admin_switches() {
    let gateway = gateway().await;
    let switches = gateway.admin(Method::GET, "/switches", "").await;
    assert_eq!(switches.body["rolloutPercent"], 100);

    // No session enforced: the loop runs, every call reaches the tool.
    let changed = gateway
        .admin(Method::PUT, "/switches", r#"{"rolloutPercent": 0}"#)
        .await;
    assert_eq!(changed.status, StatusCode::OK, "{}", changed.body);
    assert_eq!(changed.body["rolloutPercent"], 0);
    assert_eq!(changed.body["enabled"], true, "the other switches are kept");
    let before = gateway.runs();
    for answer in loop_of_four(&gateway, "s-rollout-0").await {
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        assert_eq!(answer.body["fromCache"], false);
    }
    assert_eq!(gateway.runs() - before, 4, "every repeat ran");

    // Every session enforced again: the fourth identical call is refused.
    let changed = gateway
        .admin(Method::PUT, "/switches", r#"{"rolloutPercent": 100}"#)
        .await;
    assert_eq!(changed.body["rolloutPercent"], 100);
    let answers = loop_of_four(&gateway, "s-rollout-100").await;
    assert_eq!(answers[3].body["error"]["code"], "LOOP_DETECTED");

    // Both changes went to the audit log, with the percentage before and after.
    gateway.audit_log.shutdown();
    let changes: Vec<(Value, Value)> = gateway
        .audit
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|(stream, line)| *stream == AuditStream::Events && line["type"] == "admin.change")
        .map(|(_, line)| {
            let payload = &line["payload"];
            (
                payload["before"]["rolloutPercent"].clone(),
                payload["after"]["rolloutPercent"].clone(),
            )
        })
        .collect();
    assert_eq!(changes, [(json!(100), json!(0)), (json!(0), json!(100))]);

    for (body, field) in [
        (r#"{"rolloutPercent": 101}"#, "rolloutPercent"),
        (r#"{"rolloutPercent": -1}"#, "rolloutPercent"),
        (r#"{"rolloutPercent": "ten"}"#, "rolloutPercent"),
    ] {
        let bad = gateway.admin(Method::PUT, "/switches", body).await;
        assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(bad.body["error"]["details"]["field"], field, "{body}");
    }
    let kept = gateway.admin(Method::GET, "/switches", "").await;
    assert_eq!(
        kept.body["rolloutPercent"], 100,
        "a refused change changes nothing"
    );
}
