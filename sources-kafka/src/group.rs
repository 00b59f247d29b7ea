//! Membership of a consumer group (the classic protocol), on a task of its
//! own per reader: join, the leader's range assignment, heartbeats, and
//! rebalances that wait until the reader's records are committed.
//!
//! ```text
//!  JoinGroup (MEMBER_ID_REQUIRED: again with the id given) ─▶ leader? assign ranges
//!  SyncGroup ─▶ Assigned(partitions) to the reader
//!  heartbeats every session timeout / 3
//!     REBALANCE_IN_PROGRESS, or the leader sees the partition count change
//!        ─▶ Revoke to the reader; heartbeats go on until the reader says Drained
//!           (everything it read of its partitions is committed) ─▶ JoinGroup again
//!     UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION (dropped from the group) ─▶ Revoke, join anew
//!  Leave (the reader finished and committed, or closes) ─▶ LeaveGroup
//! ```
//!
//! Members are static (`group.instance.id`: the job, its lineage and the
//! subtask): a start of the same instance after a crash takes the dead
//! member's place at once. A member gone for good leaves the group only by
//! its session's timeout (noida-db never times one out: see
//! `docs/kafka-source.md`).
//!
//! A member rejoins only once its records are committed, so the members
//! that take its partitions over read where the destination's data of them
//! ends, all of it there (Kafka's consumers commit their offsets when their
//! partitions are revoked, for the same reason). The group waits for it up
//! to the rebalance timeout, which must exceed a checkpoint's interval and
//! commit; past it the member is dropped, and its late commits are
//! superseded in the destination (never duplicated).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as AssignedTopic;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    ConsumerProtocolAssignment, ConsumerProtocolSubscription, GroupId, HeartbeatRequest,
    JoinGroupRequest, LeaveGroupRequest, SyncGroupRequest, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use sink_api::Counter;
use sink_kafka_client::group::describe_group;
use sink_kafka_client::topic::Topic;
use sink_kafka_client::{millis, str_bytes, Cluster, CoordinatorKind, WireError};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::KafkaSourceError;

/// How long a member waits for the answer to its `LeaveGroup`.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(5);

/// The assignor's name, as members announce it.
const ASSIGNOR: &str = "range";

/// How often a member waiting for the group says what the group is doing.
const REPORT_EVERY: Duration = Duration::from_secs(10);

/// How long a member pauses before it joins again after the coordinator
/// answered `REBALANCE_IN_PROGRESS` at once (a `JoinGroup` it then sends is
/// normally held until the rebalance ends; one answered at once again would
/// otherwise make a busy loop).
const REJOIN_PAUSE: Duration = Duration::from_millis(100);

/// What the subscription's user data of this source's members starts
/// with: the leader deals partitions to such members only.
const MARK: &[u8] = b"eo-kafka-source/1:";

/// What the membership task tells its reader.
#[derive(Debug)]
pub(crate) enum Event {
    /// The group's assignment of this member: these partitions, sorted.
    Assigned(Vec<i32>),
    /// A rebalance began: stop reading, and say [`Control::Drained`] once
    /// everything read is committed.
    Revoke,
    /// Membership failed for good.
    Failed(KafkaSourceError),
}

/// What the reader tells its membership task.
#[derive(Debug)]
pub(crate) enum Control {
    /// Everything read of the revoked partitions is committed: rejoin.
    Drained,
    /// Ask the group to deal its partitions again: a bounded reader waits
    /// for partitions that none of the group's members reads.
    Rebalance,
    /// Leave the group and end.
    Leave,
}

/// How a member takes part.
#[derive(Debug, Clone)]
pub(crate) struct MemberSettings {
    pub group: String,
    pub topic: String,
    pub session_timeout: Duration,
    pub rebalance_timeout: Duration,
    /// How often the leader looks for partitions added to the topic.
    pub metadata_refresh: Duration,
    /// How long joining may take, rebalances included, before the member
    /// fails naming the group's state.
    pub wait_timeout: Duration,
    /// The member's static id (`group.instance.id`), the same in every
    /// start of this instance's subtask.
    pub instance: String,
    /// Where the time spent joining and syncing is counted, in
    /// milliseconds, as it passes (every [`REPORT_EVERY`] and at the end of
    /// each join): the job's `kafka_source_group_wait_ms`.
    pub waited: Counter,
}

/// Starts the membership of one reader; the handle's channels talk to it.
pub(crate) fn spawn(
    cluster: Arc<Cluster>,
    settings: MemberSettings,
) -> (
    mpsc::UnboundedReceiver<Event>,
    mpsc::UnboundedSender<Control>,
    tokio::task::JoinHandle<()>,
) {
    let (events_tx, events) = mpsc::unbounded_channel();
    let (control, control_rx) = mpsc::unbounded_channel();
    let member = Member {
        cluster,
        settings,
        member_id: String::new(),
        generation: -1,
        rejoins_asked: 0,
        events: events_tx,
        control: control_rx,
        leader: Arc::default(),
    };
    let task = tokio::spawn(member.run());
    (events, control, task)
}

struct Member {
    cluster: Arc<Cluster>,
    settings: MemberSettings,
    member_id: String,
    generation: i32,
    /// How many rebalances this member asked for: in its subscription's
    /// user data, so that its next `JoinGroup` differs from the last and
    /// the coordinator deals again (Kafka answers a follower that rejoins
    /// with the same subscription with the assignment it has).
    rejoins_asked: u32,
    events: mpsc::UnboundedSender<Event>,
    control: mpsc::UnboundedReceiver<Control>,
    /// The member id of the group's leader, as the last `JoinGroup` answer
    /// named it: for the messages of a group that does not settle.
    leader: Arc<Mutex<Option<String>>>,
}

/// Why a member stops heartbeating in a generation.
enum Leaving {
    /// A rebalance: rejoin once drained.
    Rebalance,
    /// The reader asked to leave, or is gone.
    Leave,
}

impl Member {
    async fn run(mut self) {
        let group = self.settings.group.clone();
        loop {
            // A reader that is gone (its job ended or failed) does not wait
            // for a rebalance to finish: it leaves at once.
            let events = self.events.clone();
            let joined = tokio::select! {
                joined = self.join() => Some(joined),
                () = events.closed() => None,
            };
            let assigned = match joined {
                Some(Ok(assigned)) => assigned,
                Some(Err(error)) => {
                    // No LeaveGroup: a member whose join failed may have been
                    // fenced by a newer start of its instance, and leaving by
                    // its static id could take that start's place away.
                    let _ = self.events.send(Event::Failed(error));
                    return;
                }
                None => {
                    // The cut-short JoinGroup may still be waiting at the
                    // coordinator, and a broker answers a connection's
                    // requests in order: the LeaveGroup goes on a
                    // connection of its own, or waits behind it.
                    self.cluster = Arc::new(Cluster::new(self.cluster.config.clone()));
                    self.leave().await;
                    return;
                }
            };
            info!(%group, generation = self.generation, partitions = ?assigned, "assigned");
            let leader_partitions = assigned.1;
            if self.events.send(Event::Assigned(assigned.0)).is_err() {
                self.leave().await;
                return;
            }
            match self.heartbeat_until_rebalance(leader_partitions).await {
                Leaving::Leave => {
                    self.leave().await;
                    return;
                }
                Leaving::Rebalance => {}
            }
            if self.events.send(Event::Revoke).is_err() {
                self.leave().await;
                return;
            }
            match self.heartbeat_until_drained().await {
                Leaving::Leave => {
                    self.leave().await;
                    return;
                }
                Leaving::Rebalance => {}
            }
        }
    }

    /// Joins the group (again) and syncs: this member's partitions, and,
    /// for the leader, how many partitions the topic had when it assigned
    /// them. Bounded by the wait timeout, rebalances included; every
    /// [`REPORT_EVERY`] of waiting it says (at WARN) what the group is doing,
    /// and past the bound it fails naming that.
    async fn join(&mut self) -> Result<(Vec<i32>, Option<usize>), KafkaSourceError> {
        let started = Instant::now();
        let deadline = started + self.settings.wait_timeout;
        let group = self.settings.group.clone();
        // A connection of its own: a broker answers a connection's requests
        // in order, and the member's may hold a JoinGroup for a minute.
        let observer = Cluster::new(self.cluster.config.clone());
        let leader = Arc::clone(&self.leader);
        let mut report = tokio::time::interval_at((started + REPORT_EVERY).into(), REPORT_EVERY);
        let waited = self.settings.waited.clone();
        let mut counted = Duration::ZERO;
        // The last attempt's error when the cluster itself failed (it could
        // not be reached, or answered a retriable error); `None` while the
        // coordinator answers, or holds a JoinGroup (a request it answers
        // no sooner than its rebalance ends is the group waiting, not the
        // cluster failing).
        let cluster_failing: Mutex<Option<WireError>> = Mutex::new(None);
        let set_failing = |error: Option<WireError>| {
            *cluster_failing
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = error;
        };
        let joining = async {
            loop {
                match self.join_once().await {
                    Ok(Some(assigned)) => return Ok(assigned),
                    Ok(None) => set_failing(None),
                    Err(error) if error.is_retriable() => {
                        debug!(group = %self.settings.group, %error, "joining again");
                        set_failing(match error {
                            WireError::Timeout { .. } => None,
                            other => Some(other),
                        });
                        self.cluster
                            .forget_coordinator(CoordinatorKind::Group, &self.settings.group)
                            .await;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(error) => return Err(error),
                }
            }
        };
        tokio::pin!(joining);
        loop {
            tokio::select! {
                joined = &mut joining => {
                    count_wait(&waited, started, &mut counted);
                    return joined.map_err(|error| KafkaSourceError::Group {
                        group: group.clone(),
                        message: format!("joining failed: {error}"),
                    });
                }
                _ = report.tick() => {
                    count_wait(&waited, started, &mut counted);
                    let seen = describe(&observer, &group, &leader).await;
                    warn!(%group, waited = ?started.elapsed(), bound = ?deadline - started,
                        "waiting for the consumer group to deal this member its partitions: {seen}");
                }
                () = tokio::time::sleep_until(deadline.into()) => {
                    count_wait(&waited, started, &mut counted);
                    let failing = cluster_failing
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .take();
                    // The cluster failing is transient (a restart may find it
                    // back); a group that does not settle is not.
                    return Err(match failing {
                        Some(error) => KafkaSourceError::Group {
                            group: group.clone(),
                            message: format!(
                                "joining failed for {:?}: {error}",
                                started.elapsed()
                            ),
                        },
                        None => KafkaSourceError::Unsettled {
                            group: group.clone(),
                            waited: started.elapsed(),
                            seen: describe(&observer, &group, &leader).await,
                        },
                    });
                }
            }
        }
    }

    /// Membership failing for good with `message`.
    fn failed(&self, message: impl Into<String>) -> KafkaSourceError {
        KafkaSourceError::Group {
            group: self.settings.group.clone(),
            message: message.into(),
        }
    }

    /// One round of JoinGroup and SyncGroup; `None`: join again at once
    /// (a member id was given, or a rebalance began meanwhile).
    async fn join_once(&mut self) -> Result<Option<(Vec<i32>, Option<usize>)>, WireError> {
        let group = self.settings.group.clone();
        let link = self
            .cluster
            .coordinator(CoordinatorKind::Group, &group)
            .await?;
        let request = JoinGroupRequest::default()
            .with_group_id(GroupId(str_bytes(&group)))
            .with_session_timeout_ms(millis(self.settings.session_timeout))
            .with_rebalance_timeout_ms(millis(self.settings.rebalance_timeout))
            .with_member_id(str_bytes(&self.member_id))
            .with_group_instance_id(Some(str_bytes(&self.settings.instance)))
            .with_protocol_type(str_bytes("consumer"))
            .with_protocols(vec![JoinGroupRequestProtocol::default()
                .with_name(str_bytes(ASSIGNOR))
                .with_metadata(subscription(&self.settings.topic, self.rejoins_asked)?)]);
        let answer = self.cluster.call(&link, &request).await?;
        match ResponseError::try_from_code(answer.error_code) {
            None => {}
            Some(ResponseError::MemberIdRequired) => {
                self.member_id = answer.member_id.to_string();
                return Ok(None);
            }
            Some(ResponseError::UnknownMemberId) => {
                self.member_id.clear();
                return Ok(None);
            }
            Some(ResponseError::RebalanceInProgress) => {
                tokio::time::sleep(REJOIN_PAUSE).await;
                return Ok(None);
            }
            Some(code) => {
                return Err(WireError::Broker {
                    api: "JoinGroup",
                    subject: format!("group {group}"),
                    code,
                    message: None,
                })
            }
        }
        self.member_id = answer.member_id.to_string();
        self.generation = answer.generation_id;
        *self.leader.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(answer.leader.to_string());
        let is_leader = answer.leader == answer.member_id;
        let (assignments, partitions) = match is_leader {
            true => {
                let described = Topic::describe(&self.cluster, &self.settings.topic)
                    .await?
                    .ok_or_else(|| {
                        WireError::Protocol(format!(
                            "the topic {} does not exist",
                            self.settings.topic
                        ))
                    })?;
                let count = described.leaders.len();
                // A member that is not this source's (a consumer given the
                // group's id) is dealt nothing: what it read would never
                // reach the job's destination.
                let (ours, foreign): (Vec<_>, Vec<_>) =
                    answer.members.iter().partition(|m| is_ours(&m.metadata));
                for member in &foreign {
                    warn!(group = %group, member = %member.member_id,
                        instance = ?member.group_instance_id.as_ref().map(|i| i.to_string()),
                        "a member of the group is not this job's (its subscription does not say so): it is dealt no partition; stop it or give the job a group of its own");
                }
                let mut members: Vec<String> =
                    ours.iter().map(|m| m.member_id.to_string()).collect();
                members.sort();
                let dealt_nothing = foreign
                    .iter()
                    .map(|m| (m.member_id.to_string(), Vec::new()));
                let assignments = assign_ranges(&members, count)
                    .into_iter()
                    .chain(dealt_nothing)
                    .map(|(member, partitions)| {
                        Ok(SyncGroupRequestAssignment::default()
                            .with_member_id(StrBytes::from_string(member))
                            .with_assignment(assignment(&self.settings.topic, partitions)?))
                    })
                    .collect::<Result<Vec<_>, WireError>>()?;
                (assignments, Some(count))
            }
            false => (Vec::new(), None),
        };
        let request = SyncGroupRequest::default()
            .with_group_id(GroupId(str_bytes(&group)))
            .with_generation_id(self.generation)
            .with_member_id(str_bytes(&self.member_id))
            .with_group_instance_id(Some(str_bytes(&self.settings.instance)))
            .with_protocol_type(Some(str_bytes("consumer")))
            .with_protocol_name(Some(str_bytes(ASSIGNOR)))
            .with_assignments(assignments);
        let answer = self.cluster.call(&link, &request).await?;
        match ResponseError::try_from_code(answer.error_code) {
            None => {}
            Some(ResponseError::RebalanceInProgress) => {
                tokio::time::sleep(REJOIN_PAUSE).await;
                return Ok(None);
            }
            Some(ResponseError::UnknownMemberId | ResponseError::IllegalGeneration) => {
                self.member_id.clear();
                return Ok(None);
            }
            Some(code) => {
                return Err(WireError::Broker {
                    api: "SyncGroup",
                    subject: format!("group {group}"),
                    code,
                    message: None,
                })
            }
        }
        let partitions_of_member = assigned(&answer.assignment, &self.settings.topic)?;
        Ok(Some((partitions_of_member, partitions)))
    }

    /// One heartbeat; `Ok(false)` when the generation is over (a rebalance
    /// began, or this member was dropped).
    async fn heartbeat(&mut self) -> Result<bool, WireError> {
        let link = self
            .cluster
            .coordinator(CoordinatorKind::Group, &self.settings.group)
            .await?;
        let request = HeartbeatRequest::default()
            .with_group_id(GroupId(str_bytes(&self.settings.group)))
            .with_generation_id(self.generation)
            .with_member_id(str_bytes(&self.member_id))
            .with_group_instance_id(Some(str_bytes(&self.settings.instance)));
        let answer = self.cluster.call(&link, &request).await?;
        match ResponseError::try_from_code(answer.error_code) {
            None => Ok(true),
            Some(ResponseError::RebalanceInProgress) => Ok(false),
            Some(ResponseError::FencedInstanceId) => {
                // A newer start of this instance took the static id over.
                let _ = self.events.send(Event::Failed(self.failed(
                    "a newer start of this instance joined the group with its id: this one stops",
                )));
                Ok(false)
            }
            Some(ResponseError::UnknownMemberId | ResponseError::IllegalGeneration) => {
                warn!(group = %self.settings.group, "dropped from the group: joining anew");
                self.member_id.clear();
                Ok(false)
            }
            Some(code) => Err(WireError::Broker {
                api: "Heartbeat",
                subject: format!("group {}", self.settings.group),
                code,
                message: None,
            }),
        }
    }

    fn heartbeat_interval(&self) -> Duration {
        (self.settings.session_timeout / 3).max(Duration::from_millis(10))
    }

    /// Heartbeats until a rebalance begins (or, for the leader, the topic
    /// has another partition count than it assigned), or the reader asks
    /// to leave.
    async fn heartbeat_until_rebalance(&mut self, assigned_count: Option<usize>) -> Leaving {
        let mut last_refresh = Instant::now();
        loop {
            let interval = self.heartbeat_interval();
            tokio::select! {
                control = self.control.recv() => match control {
                    Some(Control::Leave) | None => return Leaving::Leave,
                    Some(Control::Drained) => {}
                    Some(Control::Rebalance) => {
                        info!(group = %self.settings.group, "rejoining to have the partitions dealt again");
                        self.rejoins_asked = self.rejoins_asked.wrapping_add(1);
                        return Leaving::Rebalance;
                    }
                },
                () = tokio::time::sleep(interval) => {
                    match self.heartbeat().await {
                        Ok(true) => {}
                        Ok(false) => return Leaving::Rebalance,
                        Err(error) if error.is_retriable() => {
                            debug!(group = %self.settings.group, %error, "heartbeat failed; again");
                            self.cluster
                                .forget_coordinator(CoordinatorKind::Group, &self.settings.group)
                                .await;
                        }
                        Err(error) => {
                            let _ = self.events.send(Event::Failed(self.failed(format!("heartbeat failed: {error}"))));
                            return Leaving::Leave;
                        }
                    }
                    if let Some(count) = assigned_count {
                        if last_refresh.elapsed() >= self.settings.metadata_refresh {
                            last_refresh = Instant::now();
                            if let Ok(Some(topic)) = Topic::describe(&self.cluster, &self.settings.topic).await {
                                if topic.leaders.len() != count {
                                    info!(group = %self.settings.group, before = count, now = topic.leaders.len(),
                                        "the topic's partitions changed: rebalancing");
                                    return Leaving::Rebalance;
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Heartbeats (their answers no longer matter) until the reader says
    /// its records are committed, or asks to leave.
    async fn heartbeat_until_drained(&mut self) -> Leaving {
        loop {
            let interval = self.heartbeat_interval();
            tokio::select! {
                control = self.control.recv() => match control {
                    Some(Control::Drained) => return Leaving::Rebalance,
                    Some(Control::Leave) | None => return Leaving::Leave,
                    // Rebalancing already.
                    Some(Control::Rebalance) => {}
                },
                () = tokio::time::sleep(interval) => {
                    if !self.member_id.is_empty() {
                        let _ = self.heartbeat().await;
                    }
                }
            }
        }
    }

    /// Leaves the group: `LeaveGroup` with this member's static id, and its
    /// member id when known. A join cut short (the reader gone while a
    /// `JoinGroup` waited for a rebalance) may have left the member in the
    /// group before its id came back: it leaves by its static id alone, or
    /// the broker keeps it (noida-db never expires it, and makes it the
    /// leader of the next generation, which then never gets an
    /// assignment). Bounded by [`LEAVE_TIMEOUT`].
    async fn leave(&mut self) {
        let group = self.settings.group.clone();
        let leave = async {
            let link = self
                .cluster
                .coordinator(CoordinatorKind::Group, &group)
                .await?;
            let request = LeaveGroupRequest::default()
                .with_group_id(GroupId(str_bytes(&group)))
                .with_members(vec![MemberIdentity::default()
                    .with_member_id(str_bytes(&self.member_id))
                    .with_group_instance_id(Some(str_bytes(&self.settings.instance)))]);
            let answer = self.cluster.call(&link, &request).await?;
            WireError::check("LeaveGroup", || format!("group {group}"), answer.error_code)
        };
        match tokio::time::timeout(LEAVE_TIMEOUT, leave).await {
            Ok(Ok(())) => info!(%group, member = %self.member_id, "left the group"),
            Ok(Err(error)) => {
                info!(%group, %error, "leaving the group failed; the session times out")
            }
            Err(_) => info!(%group, "leaving the group took too long; the session times out"),
        }
        self.member_id.clear();
    }
}

/// Adds the time since `started` not yet counted (`counted`) to `waited`,
/// in milliseconds.
fn count_wait(waited: &Counter, started: Instant, counted: &mut Duration) {
    let now = started.elapsed();
    let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    waited.add(millis(now).saturating_sub(millis(*counted)));
    *counted = now;
}

/// What the coordinator says of `group` now, for a member waiting on it:
/// its state, its members and its leader (as this member last heard).
async fn describe(observer: &Cluster, group: &str, leader: &Mutex<Option<String>>) -> String {
    let leader = match leader
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
    {
        Some(leader) => format!("; its leader, as this member last heard, is {leader}"),
        None => "; this member has not heard of a leader yet".to_string(),
    };
    match describe_group(observer, group).await {
        Ok(described) => format!(
            "the group is {} with {} member(s): {}{leader}",
            described.state,
            described.members.len(),
            described.members_text()
        ),
        Err(error) => format!("the group could not be described ({error}){leader}"),
    }
}

/// The partitions `0..count` dealt to `members` (sorted) in contiguous
/// ranges, the first members taking one more when they do not divide
/// evenly: Kafka's range assignor for one topic.
pub(crate) fn assign_ranges(members: &[String], count: usize) -> Vec<(String, Vec<i32>)> {
    let n = members.len().max(1);
    let (each, extra) = (count / n, count % n);
    let mut next = 0usize;
    members
        .iter()
        .enumerate()
        .map(|(i, member)| {
            let take = each + usize::from(i < extra);
            let partitions = (next..next + take).map(|p| p as i32).collect();
            next += take;
            (member.clone(), partitions)
        })
        .collect()
}

/// The consumer protocol's subscription to `topic` (version 0); its user
/// data counts the rebalances the member asked for.
fn subscription(topic: &str, rejoins_asked: u32) -> Result<Bytes, WireError> {
    let mut bytes = BytesMut::new();
    bytes.extend_from_slice(&0i16.to_be_bytes());
    ConsumerProtocolSubscription::default()
        .with_topics(vec![str_bytes(topic)])
        .with_user_data(Some(Bytes::from(
            [MARK, &rejoins_asked.to_be_bytes()[..]].concat(),
        )))
        .encode(&mut bytes, 0)
        .map_err(|e| WireError::Protocol(format!("encoding a subscription: {e}")))?;
    Ok(bytes.freeze())
}

/// Whether a member's subscription (`metadata`, as `JoinGroup` gives it
/// to the leader) is this source's: its user data starts with [`MARK`].
fn is_ours(metadata: &Bytes) -> bool {
    let mut buf = metadata.clone();
    if buf.len() < 2 {
        return false;
    }
    let version = i16::from_be_bytes([buf[0], buf[1]]);
    let _ = buf.split_to(2);
    ConsumerProtocolSubscription::decode(&mut buf, version.clamp(0, 3))
        .ok()
        .and_then(|s| s.user_data)
        .is_some_and(|data| data.starts_with(MARK))
}

/// The consumer protocol's assignment of `partitions` of `topic`
/// (version 0).
fn assignment(topic: &str, partitions: Vec<i32>) -> Result<Bytes, WireError> {
    let mut bytes = BytesMut::new();
    bytes.extend_from_slice(&0i16.to_be_bytes());
    ConsumerProtocolAssignment::default()
        .with_assigned_partitions(vec![AssignedTopic::default()
            .with_topic(TopicName(str_bytes(topic)))
            .with_partitions(partitions)])
        .encode(&mut bytes, 0)
        .map_err(|e| WireError::Protocol(format!("encoding an assignment: {e}")))?;
    Ok(bytes.freeze())
}

/// The partitions of `topic` an assignment holds, sorted (an empty
/// assignment: none).
fn assigned(bytes: &Bytes, topic: &str) -> Result<Vec<i32>, WireError> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let mut buf = bytes.clone();
    if buf.len() < 2 {
        return Err(WireError::Protocol("an assignment of one byte".into()));
    }
    let version = i16::from_be_bytes([buf[0], buf[1]]);
    let _ = buf.split_to(2);
    let decoded = ConsumerProtocolAssignment::decode(&mut buf, version.clamp(0, 3))
        .map_err(|e| WireError::Protocol(format!("an assignment cannot be read: {e}")))?;
    let mut partitions: Vec<i32> = decoded
        .assigned_partitions
        .iter()
        .filter(|t| t.topic.0.as_str() == topic)
        .flat_map(|t| t.partitions.iter().copied())
        .collect();
    partitions.sort_unstable();
    Ok(partitions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_every_partition_once_and_differ_by_one_at_most() {
        let members: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let dealt = assign_ranges(&members, 8);
        assert_eq!(
            dealt.iter().map(|(_, p)| p.clone()).collect::<Vec<_>>(),
            vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7]]
        );
        assert!(assign_ranges(&members, 2)[2].1.is_empty());
    }

    #[test]
    fn the_leader_tells_this_sources_members_from_others() {
        assert!(is_ours(&subscription("t", 0).unwrap()));
        assert!(is_ours(&subscription("t", 7).unwrap()));
        // A consumer's subscription: no user data, or its own.
        let mut plain = BytesMut::new();
        plain.extend_from_slice(&1i16.to_be_bytes());
        ConsumerProtocolSubscription::default()
            .with_topics(vec![str_bytes("t")])
            .encode(&mut plain, 1)
            .unwrap();
        assert!(!is_ours(&plain.clone().freeze()));
        let mut theirs = BytesMut::new();
        theirs.extend_from_slice(&0i16.to_be_bytes());
        ConsumerProtocolSubscription::default()
            .with_topics(vec![str_bytes("t")])
            .with_user_data(Some(Bytes::from_static(b"sticky")))
            .encode(&mut theirs, 0)
            .unwrap();
        assert!(!is_ours(&theirs.freeze()));
        assert!(!is_ours(&Bytes::new()));
    }

    #[test]
    fn an_assignment_reads_back_what_was_encoded() {
        let bytes = assignment("t", vec![3, 1]).unwrap();
        assert_eq!(assigned(&bytes, "t").unwrap(), vec![1, 3]);
        assert!(assigned(&bytes, "other").unwrap().is_empty());
        assert!(assigned(&Bytes::from_static(&[0]), "t").is_err());
    }
}
