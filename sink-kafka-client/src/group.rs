//! What a consumer group looks like from outside: its state and members
//! (`DescribeGroups`), for messages that name who is in a group.

use kafka_protocol::messages::{DescribeGroupsRequest, GroupId};

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
