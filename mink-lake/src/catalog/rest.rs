//! An Iceberg REST catalog as the lake's catalog (`--lake-catalog rest:URL`).
//!
//! Namespaces and tables are created, listed, loaded and dropped through
//! iceberg-catalog-rest's `RestCatalog`. Its `update_table` cannot carry mink's own
//! snapshots (iceberg keeps `TableCommit`'s builder crate-private), so [`RestCommits`]
//! POSTs mink's commits itself: the updates iceberg's metadata builder recorded while mink
//! built the next metadata, with two requirements, `assert-table-uuid` and
//! `assert-ref-snapshot-id` of `main` at the snapshot the commit was planned on. Another
//! writer that came first is then a clean `409`, a [`LakeError::CommitConflict`] that
//! tiering retries on the new state, as with the SQL catalog's compare-and-swap.
//!
//! Login: the OAuth2 client-credentials grant with the `client_id:secret` in
//! `MINK_LAKE_CATALOG_CREDENTIAL`, for the catalog and for the commits alike. A token the
//! catalog stops accepting (it expired, or the catalog restarted) is exchanged again and
//! the call made once more: `RestCommits` does it itself, and [`RenewingCatalog`] wraps
//! iceberg-rust's catalog, which would otherwise keep sending the dead token.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use iceberg::spec::MAIN_BRANCH;
use iceberg::table::Table;
use iceberg::{
    Catalog, CatalogBuilder, Namespace, NamespaceIdent, TableCommit, TableCreation, TableIdent,
    TableRequirement, TableUpdate,
};
use iceberg_catalog_rest::{
    CommitTableRequest, CommitTableResponse, REST_CATALOG_PROP_URI, RestCatalog, RestCatalogBuilder,
};
use reqwest::{Client, StatusCode, Url};
use serde::Deserialize;
use tokio::sync::Mutex;

use super::config::{CATALOG_CA_ENV, CATALOG_CREDENTIAL_ENV};
use super::{CATALOG_NAME, LakeConfig, Swap};
use crate::error::{LakeError, Result};
use crate::storage::LakeStorageFactory;

/// How long one request to the catalog may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Opens the REST catalog at `uri` (with the credential in `MINK_LAKE_CATALOG_CREDENTIAL`,
/// if set) and the client of mink's commits to it.
///
/// # Errors
/// [`LakeError::Config`] for a URL that does not parse or a malformed credential.
pub(super) async fn open(config: &LakeConfig, uri: &str) -> Result<(RenewingCatalog, RestCommits)> {
    let base =
        Url::parse(uri).map_err(|e| LakeError::Config(format!("REST catalog URL '{uri}': {e}")))?;
    let credential = match std::env::var(CATALOG_CREDENTIAL_ENV) {
        Ok(credential) if !credential.is_empty() => Some(credential),
        _ => None,
    };
    let client_credentials = credential
        .as_deref()
        .map(|credential| {
            credential
                .split_once(':')
                .map(|(id, secret)| (id.to_string(), secret.to_string()))
                .ok_or_else(|| {
                    LakeError::Config(format!(
                        "{CATALOG_CREDENTIAL_ENV} is client_id:secret, and has no ':'"
                    ))
                })
        })
        .transpose()?;
    let mut properties = HashMap::from([(
        REST_CATALOG_PROP_URI.to_string(),
        uri.trim_end_matches('/').to_string(),
    )]);
    if let Some(credential) = credential {
        properties.insert("credential".to_string(), credential);
    }
    let http = http_client()?;
    let catalog = RestCatalogBuilder::default()
        .with_client(http.clone())
        .with_storage_factory(Arc::new(LakeStorageFactory(config.storage.clone())))
        .load(CATALOG_NAME, properties)
        .await?;
    let commits = RestCommits {
        http,
        base,
        client_credentials,
        token: Mutex::default(),
    };
    Ok((RenewingCatalog(catalog), commits))
}

/// iceberg-rust's REST catalog, whose calls are made once more with a new token when the
/// catalog refuses the one held (`401`). Calls taking their argument by value
/// (`create_table`, `update_table`) are not repeated: the token is renewed for the next
/// call, and mink checks a table's existence before creating it, which renews it first.
#[derive(Debug)]
pub(super) struct RenewingCatalog(RestCatalog);

impl RenewingCatalog {
    async fn renewing<T, F, Fut>(&self, call: F) -> iceberg::Result<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = iceberg::Result<T>>,
    {
        match call().await {
            Err(error) if unauthorized(&error) => {
                self.0.invalidate_token().await?;
                call().await
            }
            other => other,
        }
    }

    async fn once<T>(&self, result: iceberg::Result<T>) -> iceberg::Result<T> {
        if let Err(error) = &result
            && unauthorized(error)
        {
            self.0.invalidate_token().await?;
        }
        result
    }
}

/// Whether the catalog refused the token (iceberg-rust reports the status in the error's
/// context only).
fn unauthorized(error: &iceberg::Error) -> bool {
    error.to_string().contains("401 Unauthorized")
}

#[async_trait]
impl Catalog for RenewingCatalog {
    async fn list_namespaces(
        &self,
        parent: Option<&NamespaceIdent>,
    ) -> iceberg::Result<Vec<NamespaceIdent>> {
        self.renewing(|| self.0.list_namespaces(parent)).await
    }

    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> iceberg::Result<Namespace> {
        self.renewing(|| self.0.create_namespace(namespace, properties.clone()))
            .await
    }

    async fn get_namespace(&self, namespace: &NamespaceIdent) -> iceberg::Result<Namespace> {
        self.renewing(|| self.0.get_namespace(namespace)).await
    }

    async fn namespace_exists(&self, namespace: &NamespaceIdent) -> iceberg::Result<bool> {
        self.renewing(|| self.0.namespace_exists(namespace)).await
    }

    async fn update_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> iceberg::Result<()> {
        self.renewing(|| self.0.update_namespace(namespace, properties.clone()))
            .await
    }

    async fn drop_namespace(&self, namespace: &NamespaceIdent) -> iceberg::Result<()> {
        self.renewing(|| self.0.drop_namespace(namespace)).await
    }

    async fn list_tables(&self, namespace: &NamespaceIdent) -> iceberg::Result<Vec<TableIdent>> {
        self.renewing(|| self.0.list_tables(namespace)).await
    }

    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        creation: TableCreation,
    ) -> iceberg::Result<Table> {
        self.once(self.0.create_table(namespace, creation).await)
            .await
    }

    async fn load_table(&self, table: &TableIdent) -> iceberg::Result<Table> {
        self.renewing(|| self.0.load_table(table)).await
    }

    async fn drop_table(&self, table: &TableIdent) -> iceberg::Result<()> {
        self.renewing(|| self.0.drop_table(table)).await
    }

    async fn purge_table(&self, table: &TableIdent) -> iceberg::Result<()> {
        self.renewing(|| self.0.purge_table(table)).await
    }

    async fn table_exists(&self, table: &TableIdent) -> iceberg::Result<bool> {
        self.renewing(|| self.0.table_exists(table)).await
    }

    async fn rename_table(&self, src: &TableIdent, dest: &TableIdent) -> iceberg::Result<()> {
        self.renewing(|| self.0.rename_table(src, dest)).await
    }

    async fn register_table(
        &self,
        table: &TableIdent,
        metadata_location: String,
    ) -> iceberg::Result<Table> {
        self.renewing(|| self.0.register_table(table, metadata_location.clone()))
            .await
    }

    async fn update_table(&self, commit: TableCommit) -> iceberg::Result<Table> {
        self.once(self.0.update_table(commit).await).await
    }
}

/// The HTTP client of the catalog and the commits: bounded requests, and the authorities
/// in `MINK_LAKE_CATALOG_CA` trusted beside the machine's roots.
fn http_client() -> Result<Client> {
    let mut builder = Client::builder().timeout(REQUEST_TIMEOUT);
    if let Some(path) = std::env::var_os(CATALOG_CA_ENV).filter(|path| !path.is_empty()) {
        let failed = |e: &dyn std::fmt::Display| {
            LakeError::Config(format!(
                "{CATALOG_CA_ENV} {}: {e}",
                std::path::Path::new(&path).display()
            ))
        };
        let pem = std::fs::read(&path).map_err(|e| failed(&e))?;
        let authorities = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| failed(&e))?;
        if authorities.is_empty() {
            return Err(failed(&"no certificate in the file"));
        }
        for authority in authorities {
            builder = builder.add_root_certificate(authority);
        }
    }
    builder
        .build()
        .map_err(|e| LakeError::Config(format!("REST catalog client: {e}")))
}

/// mink's commits to a REST catalog.
#[derive(Debug)]
pub(super) struct RestCommits {
    http: Client,
    /// The catalog's URL (the part before `/v1`).
    base: Url,
    client_credentials: Option<(String, String)>,
    /// The bearer token last issued.
    token: Mutex<Option<String>>,
}

/// The REST error model's body (iceberg-catalog-rest's `ErrorResponse` keeps its fields
/// private).
#[derive(Deserialize)]
struct ErrorResponse {
    error: ErrorModel,
}

#[derive(Deserialize)]
struct ErrorModel {
    message: String,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
}

impl RestCommits {
    /// Commits `updates` to `current`'s table if it is still the table `current` was
    /// loaded as and its `main` is still at `current`'s snapshot.
    pub(super) async fn publish(&self, current: &Table, updates: Vec<TableUpdate>) -> Swap {
        let ident = current.identifier();
        let metadata = current.metadata();
        let request = CommitTableRequest {
            identifier: Some(ident.clone()),
            requirements: vec![
                TableRequirement::UuidMatch {
                    uuid: metadata.uuid(),
                },
                TableRequirement::RefSnapshotIdMatch {
                    r#ref: MAIN_BRANCH.to_string(),
                    snapshot_id: metadata.current_snapshot_id(),
                },
            ],
            updates,
        };
        let response = match self.post(ident, &request).await {
            Ok(response) => response,
            Err(error) => return error,
        };
        let status = response.status();
        if status == StatusCode::OK {
            return match response.json::<CommitTableResponse>().await {
                Ok(committed) => {
                    Swap::Committed(Box::new(committed.metadata), committed.metadata_location)
                }
                Err(error) => Swap::Unknown(unreadable(ident, &error)),
            };
        }
        let message = match response.json::<ErrorResponse>().await {
            Ok(body) => format!("{} {}: {}", status, body.error.kind, body.error.message),
            Err(_) => format!("{status}"),
        };
        let table = ident.to_string();
        match status {
            StatusCode::CONFLICT => Swap::Lost(LakeError::CommitConflict { table, message }),
            StatusCode::NOT_FOUND => Swap::Lost(LakeError::CommitConflict {
                table,
                message: format!("the table is gone from the REST catalog ({message})"),
            }),
            // The commit state is unknown (the REST spec's 500, 502, 504 and the like).
            status if status.is_server_error() => Swap::Unknown(LakeError::RestCatalog(format!(
                "commit to {table}: {message}"
            ))),
            _ => Swap::Lost(LakeError::Refused { table, message }),
        }
    }

    /// Sends the commit with a bearer token, exchanging the credential for a new one once
    /// if the catalog does not accept the one held. An error is the commit's outcome.
    async fn post(
        &self,
        ident: &TableIdent,
        request: &CommitTableRequest,
    ) -> Result<reqwest::Response, Swap> {
        let url = self.table_url(ident).map_err(Swap::Lost)?;
        let mut renewed = false;
        loop {
            let token = self.token(renewed).await.map_err(Swap::Lost)?;
            let mut post = self.http.post(url.clone()).json(request);
            if let Some(token) = token {
                post = post.bearer_auth(token);
            }
            let response = post.send().await.map_err(|error| {
                let failure = LakeError::RestCatalog(format!("commit to {ident}: {error}"));
                // Not connected: certainly not committed. Else the catalog may have
                // committed before the answer was lost.
                match error.is_connect() || error.is_builder() {
                    true => Swap::Lost(failure),
                    false => Swap::Unknown(failure),
                }
            })?;
            if response.status() == StatusCode::UNAUTHORIZED
                && !renewed
                && self.client_credentials.is_some()
            {
                renewed = true;
                continue;
            }
            return Ok(response);
        }
    }

    /// The bearer token to send (none without a credential): the one held, or a new one
    /// when there is none or `renew`.
    async fn token(&self, renew: bool) -> Result<Option<String>> {
        let Some((client_id, secret)) = &self.client_credentials else {
            return Ok(None);
        };
        let mut held = self.token.lock().await;
        if let Some(token) = held.as_ref().filter(|_| !renew) {
            return Ok(Some(token.clone()));
        }
        let url = self.endpoint(&["oauth", "tokens"])?;
        let failed =
            |e: &dyn std::fmt::Display| LakeError::RestCatalog(format!("login at {url}: {e}"));
        let response = self
            .http
            .post(url.clone())
            .form(&[
                ("grant_type", "client_credentials"),
                ("client_id", client_id),
                ("client_secret", secret),
                ("scope", "catalog"),
            ])
            .send()
            .await
            .map_err(|e| failed(&e))?;
        if !response.status().is_success() {
            return Err(failed(&response.status()));
        }
        let token = response
            .json::<TokenResponse>()
            .await
            .map_err(|e| failed(&e))?
            .access_token;
        *held = Some(token.clone());
        Ok(Some(token))
    }

    fn table_url(&self, ident: &TableIdent) -> Result<Url> {
        self.endpoint(&[
            "namespaces",
            &ident.namespace().to_url_string(),
            "tables",
            ident.name(),
        ])
    }

    /// `<base>/v1/<segments...>`, each segment percent-encoded.
    fn endpoint(&self, segments: &[&str]) -> Result<Url> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .map_err(|()| LakeError::Config(format!("REST catalog URL '{}'", self.base)))?
            .pop_if_empty()
            .push("v1")
            .extend(segments);
        Ok(url)
    }
}

fn unreadable(ident: &TableIdent, error: &reqwest::Error) -> LakeError {
    LakeError::RestCatalog(format!(
        "commit to {ident}: committed, but the answer could not be read: {error}"
    ))
}
