//! A consumer group from outside: its state and members (`DescribeGroups`),
//! for messages that name who is in a group; and the removal of static
//! members that are gone (`LeaveGroup` by their instance ids), for an
//! operator.

use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::{DescribeGroupsRequest, GroupId, LeaveGroupRequest};

use crate::{str_bytes, Cluster, CoordinatorKind, WireError};

/// One member of a group, as its coordinator describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMember {
    /// Its member id.
    pub member_id: String,
    /// Its static id (`group.instance.id`), if it has one.
    pub instance_id: Option<String>,
    /// The client id it connected with.
    pub client_id: String,
    /// The host it connected from.
    pub client_host: String,
}

impl std::fmt::Display for GroupMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (client id {:?}, host {}",
            self.member_id, self.client_id, self.client_host
        )?;
        if let Some(instance) = &self.instance_id {
            write!(f, ", instance {instance}")?;
        }
        f.write_str(")")
    }
}

/// A group's state (`Stable`, `PreparingRebalance`, …) and its members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    /// The coordinator's name of its state.
    pub state: String,
    /// Its members.
    pub members: Vec<GroupMember>,
}

impl GroupDescription {
    /// Its members for a message, `; `-separated (`none` when empty).
    pub fn members_text(&self) -> String {
        if self.members.is_empty() {
            return "none".to_string();
        }
        self.members
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Describes `group`. Called where a message names who is in a group (a
/// foreign member, offsets the job did not commit); callers treat a
/// failure as "unknown", never as a reason to fail themselves.
pub async fn describe_group(cluster: &Cluster, group: &str) -> Result<GroupDescription, WireError> {
    let link = cluster.coordinator(CoordinatorKind::Group, group).await?;
    let request = DescribeGroupsRequest::default().with_groups(vec![GroupId(str_bytes(group))]);
    let answer = cluster.call(&link, &request).await?;
    let described = answer
        .groups
        .into_iter()
        .find(|g| g.group_id.0.as_str() == group)
        .ok_or_else(|| WireError::Protocol(format!("DescribeGroups did not describe {group}")))?;
    WireError::check(
        "DescribeGroups",
        || format!("group {group}"),
        described.error_code,
    )?;
    Ok(GroupDescription {
        state: described.group_state.to_string(),
        members: described
            .members
            .into_iter()
            .map(|m| GroupMember {
                member_id: m.member_id.to_string(),
                instance_id: m.group_instance_id.map(|i| i.to_string()),
                client_id: m.client_id.to_string(),
                client_host: m.client_host.to_string(),
            })
            .collect(),
    })
}

/// Removes the static members `instances` (their `group.instance.id`s)
/// from `group`: one `LeaveGroup` naming them, as Kafka's Admin API
/// `removeMembersFromConsumerGroup` sends it. Each must be removed, or the
/// call fails naming the first that was not.
///
/// For an operator's tool or a test, once a host is lost for good: its
/// static members hold every rebalance of the group until their session
/// times out, and for ever on a broker that never expires them. Never
/// called by the Kafka source on its own: a member that only looks dead (a
/// host cut off, not gone) must be fenced by a new start of its instance,
/// not removed.
pub async fn remove_static_members(
    cluster: &Cluster,
    group: &str,
    instances: &[String],
) -> Result<(), WireError> {
    let link = cluster.coordinator(CoordinatorKind::Group, group).await?;
    let request = LeaveGroupRequest::default()
        .with_group_id(GroupId(str_bytes(group)))
        .with_members(
            instances
                .iter()
                .map(|instance| {
                    MemberIdentity::default()
                        .with_member_id(str_bytes(""))
                        .with_group_instance_id(Some(str_bytes(instance)))
                })
                .collect(),
        );
    let answer = cluster.call(&link, &request).await?;
    WireError::check("LeaveGroup", || format!("group {group}"), answer.error_code)?;
    for member in &answer.members {
        WireError::check(
            "LeaveGroup",
            || {
                format!(
                    "group {group}, instance {}",
                    member.group_instance_id.as_deref().unwrap_or("?")
                )
            },
            member.error_code,
        )?;
    }
    Ok(())
}
