//! A small Flight SQL client: runs statements on a Flight SQL server (mink's or any
//! other) and streams their results. `mink sql --flight-sql` uses it.
//!
//! Addresses are `host:port` or `grpc://host:port` (plaintext) and `grpc+tls://host:port`
//! (TLS, trusting the certificate authority given). With credentials, the client
//! handshakes once and sends the bearer token it gets on every call.

use std::pin::Pin;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow_flight::error::FlightError;
use arrow_flight::sql::client::FlightSqlServiceClient;
use futures::{Stream, StreamExt, TryStreamExt};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::flight_sql::Credentials;

/// The rows of a statement, batch by batch, as the server streams them.
pub type RowStream = Pin<Box<dyn Stream<Item = Result<RecordBatch, FlightError>> + Send>>;

/// A connection to a Flight SQL server.
#[derive(Debug, Clone)]
pub struct FlightSqlConnection {
    channel: Channel,
    token: Option<String>,
}

impl FlightSqlConnection {
    /// Connects to `address`, logging in with `credentials` if given; `tls_ca` is the PEM
    /// certificate authority a `grpc+tls://` server's certificate is checked against.
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
            None => (format!("http://{address}"), false),
        };
        let mut endpoint = Endpoint::from_shared(uri).map_err(transport_error)?;
        if tls {
            let mut config = ClientTlsConfig::new();
            if let Some(ca) = tls_ca {
                config = config.ca_certificate(Certificate::from_pem(ca));
            }
            endpoint = endpoint.tls_config(config).map_err(transport_error)?;
        }
        let channel = endpoint.connect().await.map_err(transport_error)?;
        let mut connection = Self {
            channel,
            token: None,
        };
        if let Some(credentials) = credentials {
            let mut client = connection.client();
            client
                .handshake(&credentials.user, &credentials.password)
                .await?;
            connection.token = client.token().cloned();
        }
        Ok(connection)
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
