//! Hostile Kafka clients (issue 47), in raw frames where real clients cannot send the
//! input: record counts, group and commit metadata, bytes before a login, idle sockets.
