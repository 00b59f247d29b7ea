//! The requests this crate sends, and the versions of each it speaks.
//!
//! Each request is sent at the highest version both this crate and the
//! broker speak (the broker says which in its `ApiVersions` answer); a
//! broker that speaks none of ours is refused at connection, naming the
//! request (see `Link::version`). The ranges stop
//! below versions that change what a request means: `Produce` and `Fetch`
//! name topics (not topic ids), `FindCoordinator` looks up one key, and
//! `EndTxn` and `AddPartitionsToTxn` are the client's (not transaction
//! protocol 2's) versions. The group requests start at the versions where a
//! member is given its id by a first `JoinGroup` (`MEMBER_ID_REQUIRED`), may
//! be static (`group.instance.id`), and leaves by identity.

use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion};

/// A request of the Kafka protocol this crate sends, with its answer's
/// type and the versions it speaks.
pub trait Call: Encodable {
    /// The API key.
    const KEY: i16;
    /// The request's name, for messages.
    const NAME: &'static str;
    /// The lowest version this crate speaks.
    const MIN: i16;
    /// The highest version this crate speaks.
    const MAX: i16;
    /// The answer.
    type Response: Decodable;
    /// The request header's version at `version`.
    fn request_header_version(version: i16) -> i16;
    /// The answer header's version at `version`.
    fn response_header_version(version: i16) -> i16;
}

macro_rules! calls {
    ($($request:ident => $response:ident, $name:ident, $min:literal..=$max:literal;)*) => {
        $(
            impl Call for $request {
                const KEY: i16 = ApiKey::$name as i16;
                const NAME: &'static str = stringify!($name);
                const MIN: i16 = $min;
                const MAX: i16 = $max;
                type Response = $response;
                fn request_header_version(version: i16) -> i16 {
                    <$request as HeaderVersion>::header_version(version)
                }
                fn response_header_version(version: i16) -> i16 {
                    <$response as HeaderVersion>::header_version(version)
                }
            }
        )*
        /// Every request this crate sends: its key, name and lowest version.
        pub const ALL: &[(i16, &str, i16)] = &[
            $((ApiKey::$name as i16, stringify!($name), $min),)*
        ];
    };
}

calls! {
    ApiVersionsRequest => ApiVersionsResponse, ApiVersions, 0..=2;
    MetadataRequest => MetadataResponse, Metadata, 1..=12;
    CreateTopicsRequest => CreateTopicsResponse, CreateTopics, 2..=7;
    DeleteTopicsRequest => DeleteTopicsResponse, DeleteTopics, 1..=5;
    FindCoordinatorRequest => FindCoordinatorResponse, FindCoordinator, 1..=3;
    InitProducerIdRequest => InitProducerIdResponse, InitProducerId, 0..=4;
    AddPartitionsToTxnRequest => AddPartitionsToTxnResponse, AddPartitionsToTxn, 0..=3;
    AddOffsetsToTxnRequest => AddOffsetsToTxnResponse, AddOffsetsToTxn, 0..=3;
    TxnOffsetCommitRequest => TxnOffsetCommitResponse, TxnOffsetCommit, 0..=3;
    EndTxnRequest => EndTxnResponse, EndTxn, 0..=3;
    ProduceRequest => ProduceResponse, Produce, 3..=9;
    FetchRequest => FetchResponse, Fetch, 4..=12;
    ListOffsetsRequest => ListOffsetsResponse, ListOffsets, 2..=7;
    OffsetFetchRequest => OffsetFetchResponse, OffsetFetch, 1..=7;
    OffsetCommitRequest => OffsetCommitResponse, OffsetCommit, 2..=8;
    ListTransactionsRequest => ListTransactionsResponse, ListTransactions, 0..=1;
    DescribeTransactionsRequest => DescribeTransactionsResponse, DescribeTransactions, 0..=0;
    JoinGroupRequest => JoinGroupResponse, JoinGroup, 5..=7;
    SyncGroupRequest => SyncGroupResponse, SyncGroup, 3..=5;
    HeartbeatRequest => HeartbeatResponse, Heartbeat, 3..=4;
    LeaveGroupRequest => LeaveGroupResponse, LeaveGroup, 3..=5;
    DeleteRecordsRequest => DeleteRecordsResponse, DeleteRecords, 0..=2;
    CreatePartitionsRequest => CreatePartitionsResponse, CreatePartitions, 0..=3;
    DescribeGroupsRequest => DescribeGroupsResponse, DescribeGroups, 1..=5;
}
