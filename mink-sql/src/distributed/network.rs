//! How a coordinator and its workers reach each other: [`Workers`], the configured
//! workers that answered lately (datafusion-distributed's `WorkerResolver`), and
//! [`LoginChannels`], gRPC channels to workers whose every call carries the login
//! (its `ChannelResolver`, for the coordinator and for workers reading each other's
//! stages).

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use datafusion::error::{DataFusionError, Result};
use datafusion_distributed::{
    BoxCloneSyncChannel, ChannelResolver, DefaultChannelResolver, GetWorkerInfoRequest,
    WorkerResolver, WorkerServiceClient, create_worker_client,
};
use http::HeaderValue;
use mink_auth::Credentials;
use tonic::body::Body;
use tower::ServiceBuilder;
use url::Url;

/// How often the configured workers are asked whether they are up.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// How long a worker has to answer a probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Channels to workers, each call with the login (see the module docs).
#[derive(Clone)]
pub struct LoginChannels {
    channels: DefaultChannelResolver,
    authorization: Option<HeaderValue>,
}

impl std::fmt::Debug for LoginChannels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoginChannels")
            .field("login", &self.authorization.is_some())
            .finish_non_exhaustive()
    }
}

impl LoginChannels {
    /// Channels whose calls log in with `credentials` (none: calls carry no login).
    ///
    /// # Errors
    /// The user or password does not fit in a header.
    pub fn new(credentials: Option<&Credentials>) -> Result<Self> {
        let authorization = credentials
            .map(|credentials| {
                let basic = mink_auth::basic_header(credentials)
                    .map_err(|status| DataFusionError::Configuration(status.message().into()))?;
                HeaderValue::from_bytes(basic.as_encoded_bytes())
                    .map_err(|e| DataFusionError::Configuration(e.to_string()))
            })
            .transpose()?;
        Ok(Self {
            channels: DefaultChannelResolver::default(),
            authorization,
        })
    }
}

#[async_trait]
impl ChannelResolver for LoginChannels {
    async fn get_worker_client_for_url(
        &self,
        url: &Url,
    ) -> Result<WorkerServiceClient<BoxCloneSyncChannel>> {
        let channel = self.channels.get_channel(url).await?;
        let Some(authorization) = self.authorization.clone() else {
            return Ok(create_worker_client(channel));
        };
        let with_login = ServiceBuilder::new()
            .map_request(move |mut request: http::Request<Body>| {
                let headers = request.headers_mut();
                headers.insert(http::header::AUTHORIZATION, authorization.clone());
                request
            })
            .service(channel);
        Ok(create_worker_client(BoxCloneSyncChannel::new(with_login)))
    }
}

/// The configured workers, and which of them answered their last probe: a query is
/// planned over those only, so a worker that is down is left out of the next query and
/// one that comes up joins it within [`PROBE_INTERVAL`].
#[derive(Debug, Clone)]
pub struct Workers {
    configured: Arc<[Url]>,
    live: Arc<RwLock<Vec<Url>>>,
}

impl Workers {
    /// `configured` (`http://HOST:PORT` each), probed with `channels` every
    /// [`PROBE_INTERVAL`] on the current tokio runtime for as long as the returned value
    /// or a clone of it lives.
    pub fn probed(configured: Vec<Url>, channels: LoginChannels) -> Self {
        let workers = Self {
            configured: configured.into(),
            live: Arc::default(),
        };
        let weak = Arc::downgrade(&workers.live);
        let configured = Arc::clone(&workers.configured);
        tokio::spawn(async move {
            loop {
                let mut live = Vec::new();
                for url in configured.iter() {
                    if answers(&channels, url).await {
                        live.push(url.clone());
                    }
                }
                let Some(shared) = weak.upgrade() else {
                    return;
                };
                *shared.write().unwrap_or_else(PoisonError::into_inner) = live;
                drop(shared);
                tokio::time::sleep(PROBE_INTERVAL).await;
            }
        });
        workers
    }

    /// The workers configured, up or not.
    pub fn configured(&self) -> &[Url] {
        &self.configured
    }

    /// The workers that answered their last probe.
    pub fn live(&self) -> Vec<Url> {
        self.live
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl WorkerResolver for Workers {
    fn get_urls(&self) -> Result<Vec<Url>> {
        Ok(self.live())
    }
}

/// Whether the worker at `url` answers (and accepts the login) within
/// [`PROBE_TIMEOUT`].
async fn answers(channels: &LoginChannels, url: &Url) -> bool {
    let probe = async {
        let mut client = channels.get_worker_client_for_url(url).await.ok()?;
        client.get_worker_info(GetWorkerInfoRequest {}).await.ok()
    };
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, probe).await,
        Ok(Some(_))
    )
}
