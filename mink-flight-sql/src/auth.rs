//! Authentication: a user and password from the server's configuration, exchanged for a
//! bearer token by Flight's `Handshake`, and the token required on every other call.
//! The code is [`mink_auth`]'s, shared with the node's port: one login for every port.
//!
//! With no credentials configured every call is accepted, and the server only listens on
//! a loopback address (see [`super::serve`]).

pub(crate) use mink_auth::{Auth, HandshakeStream};
pub use mink_auth::{Credentials, TOKEN_LIFETIME};
