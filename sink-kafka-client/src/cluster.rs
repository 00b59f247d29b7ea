//! The brokers of one cluster, as the sink reaches them: a connection per
//! broker, the versions each speaks, who leads which partition, and who
//! coordinates which transactional id or group.
//!
//! Lookups (metadata, coordinators) are retried within the request timeout
//! while the broker answers that they are moving; connections that break
//! or time out are dropped and opened again on the next request.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiVersionsRequest, FindCoordinatorRequest, MetadataRequest, MetadataResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::Mutex;
use tracing::debug;

use crate::api::{Call, ALL};
use crate::connection::{Answer, Connection};
use crate::error::WireError;
use crate::security::Security;

/// How the client reaches the cluster. Made from the sink's settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `host:port` of the brokers to start from.
    pub bootstrap: Vec<String>,
    /// The client id brokers see in their logs and quotas.
    pub client_id: String,
    /// How long a connection may take.
    pub connect_timeout: Duration,
    /// How long one request may wait for its answer; also the time a lookup
    /// is retried.
    pub request_timeout: Duration,
    /// TLS and SASL (`Security::default()`: neither).
    pub security: Arc<Security>,
}

/// A connection and the versions of each request its broker speaks.
#[derive(Debug)]
pub struct Link {
    connection: Connection,
    /// key → (lowest, highest) version the broker speaks.
    versions: HashMap<i16, (i16, i16)>,
}

impl Link {
    /// The version to send `R` at: the highest both sides speak.
    fn version<R: Call>(&self) -> Result<i16, WireError> {
        let unsupported = || WireError::Unsupported {
            api: R::NAME,
            min: R::MIN,
            address: self.connection.address.clone(),
        };
        let (low, high) = *self.versions.get(&R::KEY).ok_or_else(unsupported)?;
        let version = high.min(R::MAX);
        if version < R::MIN || version < low {
            return Err(unsupported());
        }
        Ok(version)
    }

    /// `host:port`.
    pub fn address(&self) -> &str {
        &self.connection.address
    }

    /// Whether its connection broke.
    pub fn is_broken(&self) -> bool {
        self.connection.is_broken()
    }
}

/// Which kind of key a coordinator is looked up for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CoordinatorKind {
    /// A consumer group (offsets).
    Group = 0,
    /// A transactional id.
    Transaction = 1,
}

#[derive(Debug, Default)]
struct Known {
    links: HashMap<String, Arc<Link>>,
    /// broker id → `host:port`.
    brokers: HashMap<i32, String>,
    coordinators: HashMap<(CoordinatorKind, String), i32>,
}

/// The cluster. One per sink (shared by its writers and committers) or
/// per source reader.
#[derive(Debug)]
pub struct Cluster {
    /// How it was reached.
    pub config: ClientConfig,
    known: Mutex<Known>,
}

impl Cluster {
    /// A cluster reached through `config.bootstrap`; connects lazily.
    pub fn new(config: ClientConfig) -> Cluster {
        Cluster {
            config,
            known: Mutex::new(Known::default()),
        }
    }

    /// The bootstrap list, for messages.
    pub fn brokers(&self) -> String {
        self.config.bootstrap.join(",")
    }

    /// A connection to `address`: the open one, or a new one after its
    /// `ApiVersions` handshake.
    async fn link(&self, address: &str) -> Result<Arc<Link>, WireError> {
        if let Some(link) = self.known.lock().await.links.get(address) {
            if !link.connection.is_broken() {
                return Ok(link.clone());
            }
        }
        let connection = Connection::open(
            address,
            &self.config.client_id,
            self.config.connect_timeout,
            &self.config.security,
        )
        .await?;
        // Version 2: the last that every broker since Kafka 2.0 answers
        // without the flexible encoding.
        let answer = connection
            .call(
                &ApiVersionsRequest::default(),
                2,
                self.config.request_timeout,
            )
            .await?;
        WireError::check("ApiVersions", || address.to_string(), answer.error_code)?;
        let versions: HashMap<i16, (i16, i16)> = answer
            .api_keys
            .iter()
            .map(|v| (v.api_key, (v.min_version, v.max_version)))
            .collect();
        let missing: Vec<&str> = ALL
            .iter()
            .filter(|(key, _, min)| versions.get(key).is_none_or(|(_, high)| high < min))
            .map(|(_, name, _)| *name)
            .collect();
        if !missing.is_empty() {
            debug!(
                address,
                ?missing,
                "the broker lacks requests some features need"
            );
        }
        let link = Arc::new(Link {
            connection,
            versions,
        });
        self.known
            .lock()
            .await
            .links
            .insert(address.to_string(), link.clone());
        Ok(link)
    }

    /// Sends `request` on `link`; a connection that broke or timed out is
    /// forgotten, so the next request opens a new one.
    pub async fn call<R: Call>(&self, link: &Link, request: &R) -> Result<R::Response, WireError> {
        let version = link.version::<R>()?;
        let answer = link
            .connection
            .call(request, version, self.config.request_timeout)
            .await;
        if let Err(error) = &answer {
            if error.breaks_connection() {
                self.forget(link.address()).await;
            }
        }
        answer
    }

    /// Sends `request` on `link` without waiting for the answer; requests
    /// sent one after the other reach the broker in that order (see
    /// `Connection::send`).
    pub async fn send<R: Call>(&self, link: &Link, request: &R) -> Result<Answer<R>, WireError> {
        let version = link.version::<R>()?;
        link.connection.send(request, version).await
    }

    /// Waits for the answer of a request [`send`](Self::send) sent, at
    /// most the request timeout; a connection that broke or timed out is
    /// forgotten, as by [`call`](Self::call).
    pub async fn wait<R: Call>(&self, answer: Answer<R>) -> Result<R::Response, WireError> {
        let address = answer.address().to_string();
        let result = answer.wait(self.config.request_timeout).await;
        if let Err(error) = &result {
            if error.breaks_connection() {
                self.forget(&address).await;
            }
        }
        result
    }

    async fn forget(&self, address: &str) {
        let mut known = self.known.lock().await;
        let Known {
            links,
            brokers,
            coordinators,
        } = &mut *known;
        links.remove(address);
        coordinators.retain(|_, id| {
            brokers
                .get(id)
                .is_none_or(|broker| broker.as_str() != address)
        });
    }

    /// A connection to any broker: the known ones first, then the
    /// bootstrap list.
    pub async fn any(&self) -> Result<Arc<Link>, WireError> {
        let mut candidates: Vec<String> = {
            let known = self.known.lock().await;
            known.links.keys().cloned().collect()
        };
        candidates.extend(self.config.bootstrap.iter().cloned());
        let mut last = None;
        for address in candidates {
            match self.link(&address).await {
                Ok(link) => return Ok(link),
                // Refused: the next broker takes the same credentials.
                Err(error @ (WireError::Tls { .. } | WireError::Sasl { .. })) => return Err(error),
                Err(error) => last = Some(error),
            }
        }
        Err(WireError::Unreachable {
            brokers: self.brokers(),
            last: Box::new(last.unwrap_or_else(|| {
                WireError::Protocol("the list of brokers is empty".to_string())
            })),
        })
    }

    /// A connection to broker `id`, as the last metadata named it.
    pub async fn broker(&self, id: i32) -> Result<Arc<Link>, WireError> {
        let address = self.known.lock().await.brokers.get(&id).cloned();
        let address = match address {
            Some(address) => address,
            None => {
                self.metadata(&[]).await?;
                self.known
                    .lock()
                    .await
                    .brokers
                    .get(&id)
                    .cloned()
                    .ok_or_else(|| {
                        WireError::Protocol(format!("the cluster's metadata names no broker {id}"))
                    })?
            }
        };
        self.link(&address).await
    }

    /// The cluster's metadata for `topics` (none: only the brokers),
    /// without creating any topic; learns the brokers' addresses.
    pub async fn metadata(&self, topics: &[&str]) -> Result<MetadataResponse, WireError> {
        let link = self.any().await?;
        let request = MetadataRequest::default()
            .with_topics(Some(
                topics
                    .iter()
                    .map(|t| {
                        MetadataRequestTopic::default()
                            .with_name(Some(TopicName(StrBytes::from_string(t.to_string()))))
                    })
                    .collect(),
            ))
            .with_allow_auto_topic_creation(false);
        let answer = self.call(&link, &request).await?;
        let mut known = self.known.lock().await;
        for broker in &answer.brokers {
            known
                .brokers
                .insert(broker.node_id.0, format!("{}:{}", broker.host, broker.port));
        }
        Ok(answer)
    }

    /// The broker coordinating `key` (a transactional id or a group), with
    /// the lookup retried while the cluster says it is moving, up to the
    /// request timeout.
    pub async fn coordinator(
        &self,
        kind: CoordinatorKind,
        key: &str,
    ) -> Result<Arc<Link>, WireError> {
        let cached = self
            .known
            .lock()
            .await
            .coordinators
            .get(&(kind, key.to_string()))
            .copied();
        if let Some(id) = cached {
            if let Ok(link) = self.broker(id).await {
                return Ok(link);
            }
        }
        let request = FindCoordinatorRequest::default()
            .with_key(StrBytes::from_string(key.to_string()))
            .with_key_type(kind as i8);
        let deadline = Instant::now() + self.config.request_timeout;
        loop {
            let attempt = async {
                let link = self.any().await?;
                let answer = self.call(&link, &request).await?;
                WireError::check("FindCoordinator", || key.to_string(), answer.error_code)?;
                let address = format!("{}:{}", answer.host, answer.port);
                let mut known = self.known.lock().await;
                known.brokers.insert(answer.node_id.0, address.clone());
                known
                    .coordinators
                    .insert((kind, key.to_string()), answer.node_id.0);
                drop(known);
                self.link(&address).await
            };
            match attempt.await {
                Ok(link) => return Ok(link),
                Err(error) if error.is_retriable() && Instant::now() < deadline => {
                    debug!(key, %error, "looking the coordinator up again");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Forgets the coordinator of `key`, after it answered that it is not
    /// (or no longer) the coordinator.
    pub async fn forget_coordinator(&self, kind: CoordinatorKind, key: &str) {
        self.known
            .lock()
            .await
            .coordinators
            .remove(&(kind, key.to_string()));
    }
}
