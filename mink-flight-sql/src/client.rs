//! A small Flight SQL client: runs statements on a Flight SQL server (mink's or any
//! other) and streams their results. `mink sql --connect` uses it.
//!
//! Addresses are `host:port` or `grpc://host:port` (plaintext) and `grpc+tls://host:port`
//! (TLS, trusting the certificate authority given). With credentials, the client
//! handshakes once and sends the bearer token it gets on every call. A connection that
//! cannot be made within [`CONNECT_TIMEOUT`] fails.

use std::pin::Pin;
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow_flight::error::FlightError;
use arrow_flight::sql::SqlInfo;
use arrow_flight::sql::client::FlightSqlServiceClient;
use futures::{Stream, StreamExt, TryStreamExt};
use tonic::transport::{Channel, Endpoint};

use crate::Credentials;

/// How long opening a connection (TCP, and TLS when asked) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The rows of a statement, batch by batch, as the server streams them.
pub type RowStream = Pin<Box<dyn Stream<Item = Result<RecordBatch, FlightError>> + Send>>;

/// A connection to a Flight SQL server.
#[derive(Debug, Clone)]
pub struct FlightSqlConnection {
    channel: Channel,
    token: Option<String>,
}

impl FlightSqlConnection {
    /// Connects to `address`, logging in with `credentials` if given. A `grpc+tls://`
    /// server's certificate is checked against `tls_ca` (a PEM certificate authority)
    /// when given, otherwise against the system's trusted roots.
    ///
    /// # Errors
    /// A malformed address, a server that cannot be reached, or refused credentials.
    pub async fn connect(
        address: &str,
        credentials: Option<&Credentials>,
        tls_ca: Option<&[u8]>,
    ) -> Result<Self, FlightError> {
        let (uri, tls) = match address.split_once("://") {
            Some(("grpc+tls", rest)) => (format!("https://{rest}"), true),
            Some(("grpc" | "grpc+tcp", rest)) => (format!("http://{rest}"), false),
            Some((scheme, _)) => {
                return Err(FlightError::ProtocolError(format!(
                    "unknown scheme {scheme}://: use grpc:// or grpc+tls://"
                )));
            }
            // A certificate authority asks for TLS.
            None if tls_ca.is_some() => (format!("https://{address}"), true),
            None => (format!("http://{address}"), false),
        };
        let mut endpoint = Endpoint::from_shared(uri)
            .map_err(transport_error)?
            .connect_timeout(CONNECT_TIMEOUT)
            .max_frame_size(mink_auth::CLIENT_MAX_FRAME_BYTES);
        if tls {
            endpoint = endpoint
                .tls_config(mink_auth::client_tls(tls_ca))
                .map_err(transport_error)?;
        }
        let channel = endpoint.connect().await.map_err(transport_error)?;
        let mut connection = Self {
            channel,
            token: None,
        };
        if let Some(credentials) = credentials {
            let login = connection.handshake(credentials);
            connection.token = tokio::time::timeout(CONNECT_TIMEOUT, login)
                .await
                .map_err(|_| {
                    FlightError::protocol(format!(
                        "no answer to the login within {CONNECT_TIMEOUT:?}"
                    ))
                })??;
        }
        Ok(connection)
    }

    /// Logs in: a `Handshake` carrying `authorization: Basic base64(user:password)`,
    /// answered with `authorization: Bearer <token>` ([`mink_auth::login`]).
    /// Done there rather than by arrow-flight's `handshake`, which turns a refusal's
    /// status (`Unauthenticated: wrong user or password`) into text.
    async fn handshake(&self, credentials: &Credentials) -> Result<Option<String>, FlightError> {
        Ok(mink_auth::login(self.channel.clone(), Some(credentials)).await?)
    }

    /// Asks for the `FlightInfo` of the server's SQL info (`GetFlightInfo` with
    /// `CommandGetSqlInfo`; no rows are fetched): the cheapest call that only a Flight SQL
    /// server answers. A plain Flight server, such as a mink node's own endpoint, answers
    /// `Unimplemented`; a Flight SQL server that requires a login and was given none
    /// answers `Unauthenticated`.
    ///
    /// # Errors
    /// The server's status, or the transport's failure.
    pub async fn ping(&self) -> Result<(), FlightError> {
        let mut client = self.client();
        client
            .get_sql_info(vec![SqlInfo::FlightSqlServerName])
            .await?;
        Ok(())
    }

    /// Runs `sql` through the query path (as ADBC does for every statement): its
    /// result's schema, and its rows from every endpoint in turn.
    ///
    /// # Errors
    /// The server refused the statement (the status carries the SQL error).
    pub async fn execute(&self, sql: &str) -> Result<(SchemaRef, RowStream), FlightError> {
        let mut client = self.client();
        let info = client.execute(sql.to_string(), None).await?;
        let schema = std::sync::Arc::new(info.clone().try_decode_schema()?);
        let tickets: Vec<_> = info.endpoint.into_iter().filter_map(|e| e.ticket).collect();
        let connection = self.clone();
        let rows = futures::stream::iter(tickets)
            .then(move |ticket| {
                let mut client = connection.client();
                async move { client.do_get(ticket).await }
            })
            .try_flatten();
        Ok((schema, Box::pin(rows)))
    }

    /// Runs `sql` like [`FlightSqlConnection::execute`] and collects its whole result
    /// (for small results: tests, scripts).
    ///
    /// # Errors
    /// The server refused the statement, or failed while streaming it.
    pub async fn query(&self, sql: &str) -> Result<(SchemaRef, Vec<RecordBatch>), FlightError> {
        let (schema, rows) = self.execute(sql).await?;
        Ok((schema, rows.try_collect().await?))
    }

    fn client(&self) -> FlightSqlServiceClient<Channel> {
        let mut client = FlightSqlServiceClient::new(self.channel.clone());
        if let Some(token) = &self.token {
            client.set_token(token.clone());
        }
        client
    }
}

fn transport_error(error: tonic::transport::Error) -> FlightError {
    FlightError::ExternalError(Box::new(error))
}
