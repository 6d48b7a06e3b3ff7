//! Waiting on completion channels: one `SUBSCRIBE` per channel and process, however many
//! calls wait on it, over one RESP3 connection that resubscribes after a reconnect.
//!
//! On a cluster, a channel is a sharded one (`SSUBSCRIBE`, Redis 7): the cluster client
//! subscribes on the master of the channel's slot, the record's own, where `SPUBLISH` of the
//! finalize script delivers, so a completion never crosses the cluster bus. When that master
//! fails over, the client subscribes again on the node that takes the slot over; a message
//! published in between is lost, and the waiter learns of the record by its next read (at
//! most the fallback poll interval later, and at the end of the lease).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, PushInfo, PushKind, RedisResult, Value};
use tokio::sync::watch;

use crate::support::node::{connection, resp3_client};
use crate::support::{bounded, cluster, Endpoint, Pushes};
use tower_toolcall::idempotency::StoreError;
use tower_toolcall::ConfigError;

/// The subscriptions of one store: its connection and the waiters of each channel.
pub(super) struct Subscriber {
    endpoint: SubscriberEndpoint,
    channels: Arc<Channels>,
    timeout: Duration,
}

/// Where the subscriptions are made, and their connection once made. One per store, made
/// once: its size does not matter.
#[allow(clippy::large_enum_variant)]
enum SubscriberEndpoint {
    Node {
        client: Client,
        config: ConnectionManagerConfig,
        connection: OnceLock<Result<ConnectionManager, String>>,
    },
    Cluster(cluster::Subscriptions),
}

/// The subscriptions' connection.
#[derive(Clone)]
enum SubscriberLink {
    Node(ConnectionManager),
    Cluster(cluster::Link),
}

impl SubscriberLink {
    async fn subscribe(mut self, channel: &str) -> RedisResult<()> {
        match &mut self {
            SubscriberLink::Node(conn) => conn.subscribe(channel).await,
            SubscriberLink::Cluster(conn) => conn.ssubscribe(channel).await,
        }
    }

    async fn unsubscribe(mut self, channel: &str) -> RedisResult<()> {
        match &mut self {
            SubscriberLink::Node(conn) => conn.unsubscribe(channel).await,
            SubscriberLink::Cluster(conn) => conn.sunsubscribe(channel).await,
        }
    }
}

/// The channels this process is subscribed to. The connection hands messages to it.
#[derive(Default)]
struct Channels {
    slots: Mutex<HashMap<String, Arc<ChannelSlot>>>,
}

struct ChannelSlot {
    /// Serializes `SUBSCRIBE` and `UNSUBSCRIBE` of the channel.
    control: tokio::sync::Mutex<SlotState>,
    /// The latest message.
    messages: watch::Sender<Option<Arc<[u8]>>>,
}

#[derive(Default)]
struct SlotState {
    subscribers: usize,
    /// Removed from the map: a new waiter makes a new slot.
    retired: bool,
}

/// One waiter's subscription to a channel; dropping it unsubscribes the last waiter.
pub(super) struct Subscription {
    subscriber: Arc<Subscriber>,
    channel: String,
    slot: Arc<ChannelSlot>,
    messages: watch::Receiver<Option<Arc<[u8]>>>,
}

impl Subscriber {
    /// Subscriptions over a RESP3 connection to `endpoint` made on first use; `field` names
    /// the URL's setting in the error.
    pub(super) fn new(
        field: &str,
        endpoint: &Endpoint,
        timeout: Duration,
    ) -> Result<Subscriber, ConfigError> {
        let channels = Arc::new(Channels::default());
        let endpoint = match endpoint {
            Endpoint::Node(node) => {
                let dispatch_to = channels.clone();
                let config = node
                    .config()
                    .clone()
                    .set_push_sender(move |info: PushInfo| {
                        dispatch_to.dispatch(info);
                        Ok::<(), std::convert::Infallible>(())
                    })
                    .set_automatic_resubscription();
                SubscriberEndpoint::Node {
                    client: resp3_client(field, node.client())?,
                    config,
                    connection: OnceLock::new(),
                }
            }
            Endpoint::Cluster(cluster) => SubscriberEndpoint::Cluster(cluster.subscriptions()),
        };
        Ok(Subscriber {
            endpoint,
            channels,
            timeout,
        })
    }

    /// How many channels this process is subscribed to.
    pub(super) fn channel_count(&self) -> usize {
        self.channels.lock().len()
    }

    async fn connection(&self) -> Result<SubscriberLink, StoreError> {
        match &self.endpoint {
            SubscriberEndpoint::Node {
                client,
                config,
                connection: cell,
            } => Ok(SubscriberLink::Node(connection(cell, client, config)?)),
            SubscriberEndpoint::Cluster(subscriptions) => {
                let dispatch_to = self.channels.clone();
                let pushes: Pushes = Arc::new(move |info| dispatch_to.dispatch(info));
                let conn = subscriptions.connection(pushes).await?;
                Ok(SubscriberLink::Cluster(conn))
            }
        }
    }

    /// Subscribes to `channel`; the subscription holds every message that comes after the
    /// server confirmed it.
    pub(super) async fn subscribe(
        self: &Arc<Self>,
        channel: &str,
    ) -> Result<Subscription, StoreError> {
        let conn = self.connection().await?;
        loop {
            let slot = self.channels.slot(channel);
            let messages = slot.messages.subscribe();
            let mut state = slot.control.lock().await;
            if state.retired {
                continue;
            }
            if state.subscribers == 0 {
                let subscribed = bounded(self.timeout, conn.clone().subscribe(channel)).await;
                if let Err(error) = subscribed {
                    state.retired = true;
                    self.channels.remove(channel, &slot);
                    return Err(error);
                }
            }
            state.subscribers += 1;
            drop(state);
            return Ok(Subscription {
                subscriber: self.clone(),
                channel: channel.to_owned(),
                slot,
                messages,
            });
        }
    }
}

impl Subscription {
    /// The next message, or `None` when none came within `within`.
    pub(super) async fn next_message(&mut self, within: Duration) -> Option<Arc<[u8]>> {
        match tokio::time::timeout(within, self.messages.changed()).await {
            Ok(Ok(())) => self.messages.borrow_and_update().clone(),
            Ok(Err(_)) | Err(_) => None,
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let subscriber = self.subscriber.clone();
        let channel = std::mem::take(&mut self.channel);
        let slot = self.slot.clone();
        let leave = async move {
            let mut state = slot.control.lock().await;
            state.subscribers -= 1;
            if state.subscribers > 0 {
                return;
            }
            // Unsubscribe before the slot leaves the map, so that a new waiter's SUBSCRIBE
            // comes after this UNSUBSCRIBE.
            if let Ok(conn) = subscriber.connection().await {
                let left = bounded(subscriber.timeout, conn.unsubscribe(&channel)).await;
                if let Err(error) = left {
                    tracing::debug!(%error, "cannot unsubscribe from a completion channel");
                }
            }
            state.retired = true;
            subscriber.channels.remove(&channel, &slot);
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(leave);
        }
    }
}

impl Channels {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<ChannelSlot>>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn slot(&self, channel: &str) -> Arc<ChannelSlot> {
        self.lock()
            .entry(channel.to_owned())
            .or_insert_with(|| {
                Arc::new(ChannelSlot {
                    control: tokio::sync::Mutex::new(SlotState::default()),
                    messages: watch::channel(None).0,
                })
            })
            .clone()
    }

    fn remove(&self, channel: &str, slot: &Arc<ChannelSlot>) {
        let mut slots = self.lock();
        if slots.get(channel).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            slots.remove(channel);
        }
    }

    /// Hands a message to the waiters of its channel. Runs on the connection's task: it never
    /// blocks.
    fn dispatch(&self, info: PushInfo) {
        if !matches!(info.kind, PushKind::Message | PushKind::SMessage) {
            return;
        }
        let mut data = info.data.into_iter();
        let (Some(Value::BulkString(channel)), Some(Value::BulkString(payload))) =
            (data.next(), data.next())
        else {
            return;
        };
        let Ok(channel) = std::str::from_utf8(&channel) else {
            return;
        };
        let slot = self.lock().get(channel).cloned();
        if let Some(slot) = slot {
            slot.messages.send_replace(Some(payload.into()));
        }
    }
}
