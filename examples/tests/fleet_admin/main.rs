//! The admin API of one replica of a fleet on a real `redis-server`: its operator actions
//! reach the other replicas, and bad input reaches none.

use std::time::Duration;

use tower_toolcall::registry::ToolRegistry;
use tower_toolcall::{BreakerState, StackLayer, ToolStack};
use tower_toolcall_redis::FleetControl;
use tower_toolcall_test::eventually;
use tower_toolcall_test::redis_server::RedisServer;

const WEB: &str = "agents.tools.web";

/// One replica: its stack.
struct Replica {
    stack: ToolStack,
}

/// A replica joined to the fleet on `server`.
struct Member {
    replica: Replica,
    fleet: FleetControl,
}

/// A replica with the default stack (without idempotency), joined to the fleet on `server`
/// and synced.
async fn member(server: &RedisServer) -> Member {
    let stack = ToolStack::builder(ToolRegistry::open())
        .without(StackLayer::Idempotency)
        .build()
        .expect("a valid stack");
    let fleet = FleetControl::builder(server.url())
        .operation_timeout(Duration::from_millis(200))
        .join(&stack)
        .expect("a valid fleet configuration");
    fleet.sync().await.expect("the fleet's Redis answers");
    Member {
        replica: Replica { stack },
        fleet,
    }
}

fn breaker_state(member: &Member) -> BreakerState {
    member
        .replica
        .stack
        .breakers()
        .unwrap()
        .state(WEB, "search")
}

/// The admin API of `member`'s stack, sending through its fleet, on a bound loopback port;
/// answers `(status, body)` of each request.
mod admin_api {
    use super::*;
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;
    use hyper::{Method, Request};
    use hyper_util::rt::TokioIo;
    use tower_toolcall_axum::AdminRouter;

    const TOKEN: &str = "a long enough admin token for tests";

    pub(super) struct Admin {
        addr: std::net::SocketAddr,
    }

    pub(super) async fn serve(member: &Member) -> Admin {
        let app = AdminRouter::new(&member.replica.stack, TOKEN)
            .unwrap()
            .fleet(member.fleet.clone())
            .into_router();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Admin { addr }
    }

    impl Admin {
        pub(super) async fn send(&self, method: Method, path: &str, body: &str) -> (u16, String) {
            let stream = tokio::net::TcpStream::connect(self.addr).await.unwrap();
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .unwrap();
            tokio::spawn(connection);
            let request = Request::builder()
                .method(method)
                .uri(format!("http://{}{path}", self.addr))
                .header("host", self.addr.to_string())
                .header("content-type", "application/json")
                .header("authorization", format!("Bearer {TOKEN}"))
                .body(Full::new(Bytes::from(body.to_owned())))
                .unwrap();
            let response = sender.send_request(request).await.unwrap();
            let status = response.status().as_u16();
            let bytes = response.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8_lossy(&bytes).into_owned())
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_to_the_admin_api_leaves_the_other_replicas_untouched() {
    use hyper::Method;
    let server = RedisServer::start();
    let a = member(&server).await;
    let b = member(&server).await;
    let admin = admin_api::serve(&a).await;

    for (method, path, body) in [
        (Method::POST, "/breakers/no-such-key/force-open", ""),
        (Method::POST, "/breakers/dependency:/reset", ""),
        (
            Method::PUT,
            "/switches",
            r#"{"enabled": false, "shadow": {"no_such_layer": true}}"#,
        ),
        (Method::PUT, "/switches", r#"{"enabled": "no"}"#),
    ] {
        let (status, answer) = admin.send(method, path, body).await;
        assert!(
            (400..500).contains(&status),
            "{path} {body}: {status} {answer}"
        );
    }
    // Nothing was sent: a valid action is the first message B sees.
    let (status, answer) = admin
        .send(
            Method::POST,
            "/breakers/tool:agents.tools.web::search/force-open",
            "",
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    eventually("the force-open on B", || {
        breaker_state(&b) == BreakerState::ForcedOpen
    })
    .await;
    let stats = b.fleet.stats();
    assert_eq!((stats.applied, stats.refused), (1, 0));
    assert!(b.replica.stack.control().is_enabled());

    let (status, answer) = admin
        .send(Method::PUT, "/switches", r#"{"enabled": false}"#)
        .await;
    assert_eq!(status, 200, "{answer}");
    let control = b.replica.stack.control().clone();
    eventually("the kill switch on B", || !control.is_enabled()).await;
}
