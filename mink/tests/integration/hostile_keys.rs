//! Primary keys too long for the KV store (issue 47), refused on every write path, and
//! what a write answered with an error means once its group is in the log.
