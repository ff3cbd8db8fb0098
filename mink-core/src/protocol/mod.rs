//! Wire messages of the bucket leader's Flight protocol (`docs/design.md#read-protocol`).
//!
//! Every message is protobuf (prost), carried in Flight's opaque byte fields:
//!
//! | Flight call   | carries                                  | message                      |
//! |---------------|------------------------------------------|------------------------------|
//! | DoGet         | `Ticket.ticket`                          | [`ReadTicket`]: Scan, Snapshot, LimitScan, Union, Lake |
//! | DoExchange    | first message's `app_metadata`           | [`TailRequest`], one per poll |
//! | DoPut         | `FlightDescriptor.cmd`                   | [`WriteHeader`]              |
//! | DoPut reply   | `PutResult.app_metadata`                 | [`AppendAck`], one per batch |
//! | batch replies | `FlightData.app_metadata`                | [`ScanBatch`] / [`SnapshotBatch`] |
//! | end of a poll | data-less `FlightData.app_metadata`      | [`TailEnd`]                  |
//! | DoAction      | `Action.body` / `Result.body`            | see [`action`]               |
//!
//! Tables travel as [`TableDescriptorProto`], their schemas as Arrow IPC schema
//! flatbuffers, so any Arrow implementation can read them.
//!
//! The messages are defined by `mink-core/proto/mink/node/v1/node.proto`, the source of
//! truth for clients in other languages; the prost structs here encode exactly as it says
//! (`mink-core/tests/proto.rs` checks every message, field and enum value).
//!
//! The structs are re-exported here from `messages`; [`encode_batch`] and
//! [`encode_schema`] (with their decoders) carry Arrow data inside them, and a
//! [`TableDescriptorProto`] converts to and from a [`crate::table::TableDescriptor`].

pub mod action;
mod descriptor;
mod ipc;
pub mod limits;
mod messages;

pub use ipc::{decode_batch, decode_schema, encode_batch, encode_schema};
pub use messages::*;
use prost::Message;

use crate::{CoreError, Result};

/// Decodes a protobuf message, naming it in the error.
pub fn decode<M: Message + Default>(what: &'static str, bytes: &[u8]) -> Result<M> {
    M::decode(bytes).map_err(|source| CoreError::Malformed { what, source })
}

#[cfg(test)]
mod tests;
