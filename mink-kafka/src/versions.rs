//! The Kafka APIs and versions the listener answers, as `ApiVersions` announces them.
//!
//! Clients ask `ApiVersions` first and then use, per API, the highest version both sides
//! know; a request outside these ranges is answered with `UNSUPPORTED_VERSION`
//! (see [`crate::connection`]). Fetch stops at v12: from v13 topics are named by id
//! only. SaslHandshake is v1 only: v0 sends the SASL tokens outside Kafka's framing.

use kafka_protocol::messages::ApiKey;
use kafka_protocol::messages::api_versions_response::ApiVersion;

/// `(api, lowest, highest)` for every API the listener serves.
pub(crate) const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 7),
    (ApiKey::Metadata, 1, 12),
    (ApiKey::OffsetCommit, 2, 8),
    (ApiKey::OffsetFetch, 1, 7),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::JoinGroup, 0, 7),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 4),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::SaslHandshake, 1, 1),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::SaslAuthenticate, 0, 2),
];

/// Whether the listener answers `api` at `version`.
pub(crate) fn is_supported(api: ApiKey, version: i16) -> bool {
    SUPPORTED
        .iter()
        .any(|(key, low, high)| *key == api && (*low..=*high).contains(&version))
}

/// The `api_keys` of an `ApiVersions` answer.
pub(crate) fn announced() -> Vec<ApiVersion> {
    SUPPORTED
        .iter()
        .map(|(key, low, high)| {
            ApiVersion::default()
                .with_api_key(*key as i16)
                .with_min_version(*low)
                .with_max_version(*high)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every announced range is one the codec crate can decode and encode.
    #[test]
    fn every_announced_version_is_known_to_the_codecs() {
        for (key, low, high) in SUPPORTED {
            let valid = key.valid_versions();
            assert!(
                valid.min <= *low && *high <= valid.max,
                "{key:?} {low}..={high} outside {valid}"
            );
        }
        assert!(is_supported(ApiKey::Fetch, 12));
        assert!(!is_supported(ApiKey::Fetch, 13));
        assert!(!is_supported(ApiKey::CreateTopics, 0));
    }
}
